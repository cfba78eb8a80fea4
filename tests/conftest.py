"""Suite-wide guard: a test must not leave process-wide signal handlers changed.

A changed SIGINT handler is inherited (when ignored) by every process a later test starts, and
the Ctrl-C test then sees a child that cannot be interrupted. The guard restores the handler
after each test and warns with the name of the test that changed it.
"""

from __future__ import annotations

import signal
import warnings

import pytest

GUARDED = (signal.SIGINT, signal.SIGTERM)
AT_START = {sig: signal.getsignal(sig) for sig in GUARDED}  # before any test or fixture ran


@pytest.fixture(autouse=True)
def restore_signal_handlers(request):
    """After each test, puts back the handlers the suite started with (a change made by a
    module-scoped fixture is caught at the first test that uses it)."""
    yield
    for sig, handler in AT_START.items():
        now = signal.getsignal(sig)
        if now is not handler:
            signal.signal(sig, handler)
            warnings.warn(f"after {request.node.nodeid} (or a fixture torn down before it) the "
                          f"{signal.Signals(sig).name} handler was {now!r}; restored", RuntimeWarning, stacklevel=1)
