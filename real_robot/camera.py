"""The camera interface: connect, ``read()`` the next frame, ``read_latest(max_age_ms)``, disconnect.

A background thread receives every frame as it arrives, so a frame's age is measured from when it
reached this process, and ``read_latest`` never blocks. Implementations provide three hooks:
``_open``, ``_grab`` (one frame or None on timeout) and ``_close``.
"""

from __future__ import annotations

import abc
import logging
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from real_robot.errors import StaleFrameError
from real_robot.lifecycle import requires_connection, requires_no_connection

if TYPE_CHECKING:
    import numpy as np

logger = logging.getLogger(__name__)

GRAB_TIMEOUT_MS = 100
"""How long the reader thread waits for one frame before checking whether it should stop."""


@dataclass(frozen=True)
class CameraFrame:
    """One color frame."""

    image: "np.ndarray"
    """uint8 ``[H, W, 3]``, RGB."""
    timestamp_ms: float
    """The camera's timestamp (ms); its clock depends on the device (see the implementation)."""
    frame_number: int
    """The camera's frame counter."""
    received_s: float
    """``time.monotonic()`` when the frame reached this process."""

    @property
    def age_ms(self) -> float:
        """Milliseconds since the frame reached this process (now, at each access)."""
        return (time.monotonic() - self.received_s) * 1000.0


class Camera(abc.ABC):
    """A color camera read by a background thread. Use as a context manager."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._latest: CameraFrame | None = None
        self._count = 0  # frames received since connect
        self._returned = 0  # the count of the last frame read() returned
        self._error: BaseException | None = None
        self._running = False
        self._thread: threading.Thread | None = None

    # ----- features: known without hardware ------------------------------------------------------
    @property
    @abc.abstractmethod
    def image_hw(self) -> tuple[int, int]:
        """(height, width) of the frames, from the config."""

    @property
    def features(self) -> dict[str, Any]:
        """``{"image": (H, W, 3)}``: what ``read`` returns, known while disconnected."""
        h, w = self.image_hw
        return {"image": (h, w, 3)}

    # ----- lifecycle -------------------------------------------------------------------------------
    @property
    def is_connected(self) -> bool:
        return self._running

    @requires_no_connection
    def connect(self) -> None:
        """Open the device and start receiving frames.

        Raises:
            DeviceAlreadyConnectedError: already connected.
            DeviceNotFoundError: the configured device is not attached.
        """
        self._open()
        with self._cond:
            self._latest, self._count, self._returned, self._error = None, 0, 0, None
        self._running = True
        self._thread = threading.Thread(target=self._receive, name=f"{self}-reader", daemon=True)
        self._thread.start()

    def disconnect(self) -> None:
        """Stop receiving and close the device. Safe to call when not connected."""
        if not self._running:
            return
        self._running = False
        with self._cond:
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self._close()

    def __enter__(self) -> "Camera":
        self.connect()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.disconnect()

    # ----- reading ---------------------------------------------------------------------------------
    @requires_connection
    def read(self, timeout_ms: float = 1000.0) -> CameraFrame:
        """The next frame newer than the one the previous ``read`` returned (frames in between are
        skipped), waiting up to ``timeout_ms``.

        Raises:
            StaleFrameError: no new frame within ``timeout_ms``.
            DeviceNotConnectedError: not connected.
        """
        deadline_s = time.monotonic() + timeout_ms / 1000.0
        with self._cond:
            while self._count == self._returned:
                self._raise_reader_error()
                remaining = deadline_s - time.monotonic()
                if remaining <= 0:
                    raise StaleFrameError(f"{self}: no new frame within {timeout_ms:g} ms")
                self._cond.wait(remaining)
            self._returned = self._count
            assert self._latest is not None
            return self._latest

    @requires_connection
    def read_latest(self, max_age_ms: float = 500.0) -> CameraFrame:
        """The newest frame at once, if it is recent enough (it may be one ``read`` returned before).

        Raises:
            StaleFrameError: no frame yet, or the newest is older than ``max_age_ms``.
            DeviceNotConnectedError: not connected.
        """
        with self._cond:
            self._raise_reader_error()
            frame = self._latest
        if frame is None:
            raise StaleFrameError(f"{self}: no frame received yet")
        age_ms = frame.age_ms
        if age_ms > max_age_ms:
            raise StaleFrameError(f"{self}: the newest frame is {age_ms:.0f} ms old, above max_age_ms={max_age_ms:g}")
        return frame

    def _raise_reader_error(self) -> None:
        if self._error is not None:
            raise RuntimeError(f"{self}: the frame reader failed: {self._error!r}") from self._error

    def _receive(self) -> None:
        while self._running:
            try:
                frame = self._grab(GRAB_TIMEOUT_MS)
            except Exception as e:  # kept and raised in the reading thread
                logger.exception("%s: reading a frame failed", self)
                with self._cond:
                    self._error = e
                    self._cond.notify_all()
                return
            if frame is None:
                continue
            with self._cond:
                self._latest = frame
                self._count += 1
                self._cond.notify_all()

    # ----- implementation hooks ----------------------------------------------------------------------
    @abc.abstractmethod
    def _open(self) -> None:
        """Open the device and start streaming; raise a clear error if it is not there."""

    @abc.abstractmethod
    def _grab(self, timeout_ms: int) -> CameraFrame | None:
        """Wait up to ``timeout_ms`` for one frame; None if none came."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Stop streaming and release the device."""
