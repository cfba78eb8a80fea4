"""An Intel RealSense color stream through pyrealsense2 (``pip install "vla-rl[robot]"``), live or
played back from a recording.

- Live: the devices are listed first; a serial that is not attached fails at once, naming the serials
  present (``pipeline.start()`` would block about 15 s before failing).
- Playback: a ``.db3`` recording (rosbag2, what pyrealsense2 >= 2.58 records) runs through the same
  ``rs.pipeline``. ``write_recording`` makes one from RGB arrays.
- Timestamps: ``CameraFrame.timestamp_ms`` is the frame's RealSense timestamp. For a live D400 with
  global time on (its default) that is host-clock milliseconds since the epoch; in a playback it is
  the recorded value. ``age_ms`` counts from arrival in this process, for both.
- pyrealsense2 and rclpy both carry Fast-DDS: importing pyrealsense2 *before* rclpy in one process
  crashes that process at exit. ``import_pyrealsense2`` imports rclpy first when it is installed; in
  your own code import rclpy before pyrealsense2, or keep the camera and ROS in separate processes.
"""

from __future__ import annotations

import importlib.util
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from real_robot.camera import Camera, CameraFrame
from real_robot.errors import DeviceNotFoundError, require_module

RECORDING_SUFFIX = ".db3"


@dataclass(kw_only=True)
class RealSenseCameraConfig:
    """One RealSense color stream."""

    serial: str = ""
    """The camera's serial number (printed on it; ``RealSenseCamera.find_serials()`` lists attached ones).
    Not needed for a playback."""
    width: int = 640
    """Image width (px); the camera must offer it at ``fps``."""
    height: int = 480
    """Image height (px)."""
    fps: int = 30
    """Frames per second."""
    playback_file: str | None = None
    """A ``.db3`` recording to play instead of a live camera (its color stream must be width x height)."""
    playback_real_time: bool = True
    """Play the recording at its recorded pace (True) or as fast as it is read (False)."""

    def __post_init__(self) -> None:
        for name in ("width", "height", "fps"):
            value = getattr(self, name)
            if not (isinstance(value, int) and not isinstance(value, bool) and value > 0):
                raise ValueError(f"{name}={value!r}: a positive integer")
        if self.playback_file is None:
            if not (isinstance(self.serial, str) and self.serial.strip()):
                raise ValueError(f"serial={self.serial!r}: the camera's serial number (a string such as "
                                 f"'123622270136'), or set playback_file to play a recording")
        elif Path(self.playback_file).suffix != RECORDING_SUFFIX:
            raise ValueError(f"playback_file={self.playback_file!r}: a {RECORDING_SUFFIX} recording (pyrealsense2 "
                             f">= 2.58 reads only rosbag2 recordings; ROS 1 .bag files are not readable)")


def import_pyrealsense2() -> Any:
    """``pyrealsense2`` (rclpy first when installed, see the module docstring), or ``MissingExtraError``."""
    if "pyrealsense2" not in sys.modules and "rclpy" not in sys.modules and importlib.util.find_spec("rclpy"):
        try:
            import rclpy  # noqa: F401  (loaded first: the other order crashes the process at exit)
        except ImportError:
            pass
    return require_module("pyrealsense2", extra="robot")


class RealSenseCamera(Camera):
    """A RealSense color stream (live or played back), RGB uint8 frames."""

    def __init__(self, config: RealSenseCameraConfig):
        super().__init__()
        self.config = config
        self._pipeline: Any = None
        self._rs: Any = None

    def __repr__(self) -> str:
        source = f"playback {Path(self.config.playback_file).name}" if self.config.playback_file else self.config.serial
        return f"RealSenseCamera({source})"

    @property
    def image_hw(self) -> tuple[int, int]:
        return self.config.height, self.config.width

    @staticmethod
    def find_serials() -> list[str]:
        """Serial numbers of the RealSense devices attached now (fast; no streaming)."""
        rs = import_pyrealsense2()
        return [d.get_info(rs.camera_info.serial_number) for d in rs.context().query_devices()]

    def _open(self) -> None:
        rs = self._rs = import_pyrealsense2()
        cfg = rs.config()
        if self.config.playback_file is not None:
            path = Path(self.config.playback_file)
            if not path.is_file():
                raise FileNotFoundError(f"{self}: no recording at {path}")
            cfg.enable_device_from_file(str(path), repeat_playback=False)
            cfg.enable_stream(rs.stream.color)  # whatever the recording holds; checked below
        else:
            serials = self.find_serials()
            if self.config.serial not in serials:
                raise DeviceNotFoundError(f"no RealSense camera with serial {self.config.serial!r} is attached; "
                                          f"attached: {serials if serials else 'none'}")
            cfg.enable_device(self.config.serial)
            cfg.enable_stream(rs.stream.color, self.config.width, self.config.height, rs.format.rgb8, self.config.fps)
        pipeline = rs.pipeline()
        # check the stream before streaming: stopping a playback right after starting it can crash
        # librealsense, so a refused recording is never started
        if not cfg.can_resolve(rs.pipeline_wrapper(pipeline)):
            if self.config.playback_file is not None:
                raise ValueError(f"{self}: {self.config.playback_file} holds no color stream pyrealsense2 can play: "
                                 f"not a RealSense recording (a rosbag2 .db3 with a color stream, as "
                                 f"pyrealsense2's recorder or real_robot.realsense.write_recording writes)")
            raise ValueError(f"{self}: the camera offers no {self.config.width}x{self.config.height} rgb8 color "
                             f"stream at {self.config.fps} fps")
        stream = cfg.resolve(rs.pipeline_wrapper(pipeline)).get_stream(rs.stream.color).as_video_stream_profile()
        size = (stream.height(), stream.width())
        if size != self.image_hw:
            raise ValueError(f"{self}: the color stream is {size[1]}x{size[0]}, the config asks for "
                             f"width={self.config.width}, height={self.config.height}")
        if stream.format() not in (rs.format.rgb8, rs.format.bgr8):
            raise ValueError(f"{self}: color format {stream.format()} is not supported; rgb8 or bgr8")
        profile = pipeline.start(cfg)
        if self.config.playback_file is not None:
            try:
                profile.get_device().as_playback().set_real_time(self.config.playback_real_time)
            except Exception:
                pipeline.stop()
                raise
        self._pipeline = pipeline

    def _grab(self, timeout_ms: int) -> CameraFrame | None:
        import numpy as np

        ok, frames = self._pipeline.try_wait_for_frames(timeout_ms)
        if not ok:
            return None
        received_s = time.monotonic()
        color = frames.get_color_frame()
        if not color:
            return None
        # copy: librealsense recycles the frame's buffer once the frame is released
        image = np.array(np.asanyarray(color.get_data()), dtype=np.uint8, copy=True)
        if color.get_profile().format() == self._rs.format.bgr8:
            image = np.ascontiguousarray(image[..., ::-1])
        return CameraFrame(image=image, timestamp_ms=float(color.get_timestamp()),
                           frame_number=int(color.get_frame_number()), received_s=received_s)

    def _close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.stop()
            self._pipeline = None


def write_recording(path: str | Path, images_rgb: Sequence[Any], fps: int = 30, serial: str = "000000000001",
                    start_timestamp_ms: float = 1000.0) -> Path:
    """Record RGB images as a RealSense ``.db3`` recording, playable by ``RealSenseCamera``.

    The frames go through a ``rs.software_device`` and ``rs.recorder``, pyrealsense2's own writer.
    Frame ``i`` gets frame number ``i`` and timestamp ``start_timestamp_ms + i * 1000 / fps``. A
    playback may drop the first frame.

    Args:
        path: the file to write (``.db3``; overwritten).
        images_rgb: uint8 ``[H, W, 3]`` arrays, all the same size.
        fps: the stream's frame rate (also the pace frames are fed to the recorder).
        serial: the serial number the recording reports.
        start_timestamp_ms: the first frame's timestamp.

    Returns:
        The path written.
    """
    import numpy as np

    rs = import_pyrealsense2()
    path = Path(path)
    if path.suffix != RECORDING_SUFFIX:
        raise ValueError(f"path={str(path)!r}: a {RECORDING_SUFFIX} file")
    images = [np.ascontiguousarray(np.asarray(im, dtype=np.uint8)) for im in images_rgb]
    if not images or any(im.ndim != 3 or im.shape[2] != 3 or im.shape != images[0].shape for im in images):
        raise ValueError("images_rgb: one or more uint8 [H, W, 3] arrays of the same size")
    height, width = images[0].shape[:2]
    path.unlink(missing_ok=True)

    device = rs.software_device()
    sensor = device.add_sensor("Color")
    intrinsics = rs.intrinsics()
    intrinsics.width, intrinsics.height = width, height
    intrinsics.ppx, intrinsics.ppy, intrinsics.fx, intrinsics.fy = width / 2, height / 2, float(width), float(width)
    intrinsics.model, intrinsics.coeffs = rs.distortion.none, [0.0] * 5
    stream = rs.video_stream()
    stream.type, stream.index, stream.uid = rs.stream.color, 0, 0
    stream.width, stream.height, stream.fps, stream.bpp, stream.fmt = width, height, fps, 3, rs.format.rgb8
    stream.intrinsics = intrinsics
    profile = sensor.add_video_stream(stream)
    device.register_info(rs.camera_info.serial_number, serial)
    device.register_info(rs.camera_info.name, "software recording")
    recorder = rs.recorder(str(path), device)
    sensor.open(profile)
    sensor.start(rs.frame_queue(len(images) + 1))
    for i, image in enumerate(images):
        frame = rs.software_video_frame()
        frame.pixels, frame.bpp, frame.stride = image, 3, width * 3
        frame.timestamp, frame.domain, frame.frame_number = start_timestamp_ms + i * 1000.0 / fps, \
            rs.timestamp_domain.system_time, i
        frame.profile = profile.as_video_stream_profile()
        sensor.on_video_frame(frame)
        time.sleep(1.0 / fps)  # the recorder stamps frames with arrival time: keep the pace for playback
    sensor.stop()
    sensor.close()
    del recorder  # the file is complete when the recorder is released
    return path
