"""A ``Camera`` serving one synthetic frame at a fixed rate, through the real ``Camera`` base class
(reader thread, ``read`` / ``read_latest``, freshness). It stands in for the physical camera only,
in tests whose subject is not the camera (the RealSense path itself is tested by playing back
recordings through ``rs.pipeline``)."""

from __future__ import annotations

import time

import numpy as np

from real_robot.camera import Camera, CameraFrame


class StillCamera(Camera):
    def __init__(self, height: int, width: int, fps: float = 30.0, value: int = 128):
        super().__init__()
        self._hw, self._period_s, self._value = (height, width), 1.0 / fps, value
        self._n = 0

    @property
    def image_hw(self) -> tuple[int, int]:
        return self._hw

    def _open(self) -> None:
        self._n = 0

    def _grab(self, timeout_ms: int) -> CameraFrame | None:
        time.sleep(self._period_s)
        self._n += 1
        image = np.full((*self._hw, 3), self._value, np.uint8)
        image[0, 0] = self._n % 256  # frames differ, so a stale one is detectable
        return CameraFrame(image=image, timestamp_ms=self._n * self._period_s * 1000.0, frame_number=self._n,
                           received_s=time.monotonic())

    def _close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"StillCamera({self._hw[1]}x{self._hw[0]})"
