"""Fixtures of the robot tests: arms connected to the session's franky-sim server (the ``franky_sim``
fixture of ``tests/conftest.py``; helpers in ``tests/franky_sim_server.py``), loopback addresses nobody
listens on.

The server keeps its state between clients: tests that need the TCP at a known pose home the arm
first (``homed_layer``).
"""

from __future__ import annotations

import functools
import signal
import threading

import pytest

from franky_sim_server import HOME_TCP_POSITION_M, connected_layer, free_loopback_address, settled_position_m


@pytest.fixture
def homed_layer(franky_sim):
    """A SafetyLayer over a connected, homed FrankyArm (synchronous steps) with ``sim_limits()``."""
    with connected_layer(franky_sim) as layer:
        yield layer


@pytest.fixture
def layer_factory(franky_sim):
    """``connected_layer`` bound to the session's server: ``with layer_factory(arm_overrides, **limits)``."""
    return functools.partial(connected_layer, franky_sim)


@pytest.fixture
def home_tcp_position_m():
    return HOME_TCP_POSITION_M


@pytest.fixture
def settled():
    """``settled(layer)``: the TCP position once the arm has come to rest."""
    return settled_position_m


@pytest.fixture
def free_address():
    """A loopback address with nothing listening on libfranka's ports."""
    return free_loopback_address()


@pytest.fixture
def ctrl_c_raises():
    """SIGINT raises KeyboardInterrupt here, as in a terminal's foreground job (a suite started in the
    background inherits SIGINT ignored)."""
    assert threading.current_thread() is threading.main_thread()  # where Python delivers signals
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)
