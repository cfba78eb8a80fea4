"""Connection guards shared by arms and cameras: a method that needs the device raises a typed
error instead of failing deep inside a vendor SDK; and the shield their release runs under."""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
from typing import Any, Callable, Iterator, TypeVar

from real_robot.errors import DeviceAlreadyConnectedError, DeviceNotConnectedError

F = TypeVar("F", bound=Callable[..., Any])


def requires_connection(method: F) -> F:
    """Raise ``DeviceNotConnectedError`` when ``method`` is called on a device that is not connected."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if not self.is_connected:
            raise DeviceNotConnectedError(f"{self} is not connected: call connect() first (or use it as a "
                                          f"context manager)")
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


def requires_no_connection(method: F) -> F:
    """Raise ``DeviceAlreadyConnectedError`` when ``method`` is called on a connected device."""

    @functools.wraps(method)
    def guarded(self, *args, **kwargs):
        if self.is_connected:
            raise DeviceAlreadyConnectedError(f"{self} is already connected: call disconnect() first")
        return method(self, *args, **kwargs)

    return guarded  # type: ignore[return-value]


@contextlib.contextmanager
def deferred_interrupts(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM)) -> Iterator[None]:
    """Hold Ctrl-C and SIGTERM until the block ends, then deliver them to the handlers they would have
    met (a ``KeyboardInterrupt``, a process exit, an outer ``deferred_interrupts``).

    Stopping and releasing the arm runs inside: a second Ctrl-C pressed while the first one's cleanup
    stops the arm would otherwise cut the stop itself, or skip the disconnects after it. Only the main
    thread receives signals in Python: elsewhere, and for a handler not installed from Python (rclpy's,
    which shuts its context down without raising), nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []
    previous = {}
    for signum in signals:
        handler = signal.getsignal(signum)
        if handler is not None:
            previous[signum] = signal.signal(signum, lambda received, frame: held.append(received))
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        _deliver(list(dict.fromkeys(held)))  # once each: the first Ctrl-C already asked for the stop


def _deliver(signums: list[int]) -> None:
    """Raise each signal in turn, each even when an earlier one's handler raised."""
    if signums:
        try:
            signal.raise_signal(signums[0])
        finally:
            _deliver(signums[1:])
