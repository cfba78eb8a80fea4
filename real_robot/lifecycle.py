"""Connection guards shared by arms and cameras: a method that needs the device raises a typed
error instead of failing deep inside a vendor SDK."""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

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
