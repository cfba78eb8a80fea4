"""ROS 2 camera node: a RealSense color stream (live, or a ``.db3`` recording played back) published
as ``sensor_msgs/Image`` (rgb8) on ``camera/color/image_raw`` at the camera's rate.

    python -m real_robot.nodes.camera_node --ros-args -r __node:=camera -p serial:='123622270136'

Parameters: ``serial`` (the camera's serial number) or ``playback_file`` (a ``.db3`` recording,
played in a loop unless ``loop_playback`` is false), ``width``, ``height``, ``fps`` (what to stream;
a recording must have that size), ``frame_id`` (the header's frame). The header stamp is the frame's
own timestamp (``CameraFrame.timestamp_ms``: host-clock time for a live D400 with global time on, the
recorded value in a playback).

rclpy is imported before pyrealsense2: the other order crashes the process at exit.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from real_robot.errors import StaleFrameError, require_module

READ_TIMEOUT_MS = 1000.0
"""A live camera that sends nothing for this long is reported (the node keeps waiting)."""
PLAYBACK_END_MS = 300.0
"""A recording that sends nothing for this long has ended."""

PARAMETERS = {
    "serial": ("str", "", "the RealSense serial number (live camera)"),
    "playback_file": ("str", "", "a .db3 recording to publish instead of a live camera"),
    "width": ("int", 640, "image width (px)"),
    "height": ("int", 480, "image height (px)"),
    "fps": ("int", 30, "frames per second of the live stream"),
    "frame_id": ("str", "camera_color_optical_frame", "header.frame_id of the images"),
    "loop_playback": ("bool", True, "start a recording again when it ends"),
}


class CameraPublisher:
    """Reads a ``Camera`` in a thread and publishes every new frame."""

    def __init__(self, node: Any, camera: Any, frame_id: str, loop_playback: bool):
        from sensor_msgs.msg import Image

        from real_robot.nodes.common import IMAGE_TOPIC, image_publisher_qos

        self.node, self.camera, self.frame_id, self.loop_playback = node, camera, frame_id, loop_playback
        self.publisher = node.create_publisher(Image, IMAGE_TOPIC, image_publisher_qos())
        self.published = 0
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, name="camera-publisher", daemon=True)

    def start(self) -> None:
        self._running.set()
        self._thread.start()

    def stop(self) -> None:
        self._running.clear()
        self._thread.join(5.0)

    def _run(self) -> None:
        from real_robot.nodes.common import image_msg, safe_publish, stamp_from_seconds

        log = self.node.get_logger()
        playback = getattr(getattr(self.camera, "config", None), "playback_file", None)
        timeout_ms = PLAYBACK_END_MS if playback else READ_TIMEOUT_MS
        while self._running.is_set():
            try:
                frame = self.camera.read(timeout_ms=timeout_ms)
            except StaleFrameError:
                if not self._running.is_set():
                    break
                if playback and self.loop_playback:
                    log.info(f"{self.camera}: the recording ended; playing it again")
                    try:
                        self.camera.disconnect()
                        self.camera.connect()
                    except Exception as e:  # noqa: BLE001  as a failed read: report and end the node
                        self._fail(f"reopening the recording failed: {e!r}")
                        return
                else:
                    log.warning(f"{self.camera}: no frame within {timeout_ms:.0f} ms",
                                throttle_duration_sec=5.0)
                continue
            except Exception as e:  # noqa: BLE001  a failed reader: report and end the node
                self._fail(f"reading failed: {e!r}")
                return
            msg = image_msg(frame.image, stamp_from_seconds(frame.timestamp_ms / 1000.0), self.frame_id)
            if not safe_publish(self.node, self.publisher, msg):
                return
            self.published += 1

    def _fail(self, why: str) -> None:
        """End the node: a camera node that publishes nothing must not look alive to the graph."""
        import rclpy

        self.node.get_logger().error(f"{self.camera}: {why}; the camera node stops")
        self._running.clear()
        rclpy.try_shutdown(context=self.node.context)


def main(argv: list[str] | None = None) -> int:
    rclpy = require_module("rclpy", extra="ros")  # before pyrealsense2 (see the module docstring)
    from real_robot.nodes.common import ParameterError, configure_logging, declare_parameters, spin
    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig

    configure_logging()
    rclpy.init(args=sys.argv if argv is None else argv)
    node = rclpy.create_node("camera")
    log = node.get_logger()
    camera = publisher = None
    try:
        try:
            p = declare_parameters(node, PARAMETERS)
            camera = RealSenseCamera(RealSenseCameraConfig(
                serial=p["serial"], playback_file=p["playback_file"] or None, width=p["width"],
                height=p["height"], fps=p["fps"]))
        except (ParameterError, ValueError) as e:
            log.fatal(str(e))
            return 2
        try:
            camera.connect()
        except Exception as e:  # noqa: BLE001  no camera / bad recording: say so and exit
            log.fatal(f"{camera}: {e}")
            return 1
        publisher = CameraPublisher(node, camera, p["frame_id"], p["loop_playback"])
        publisher.start()
        log.info(f"publishing {camera} ({p['width']}x{p['height']}) on {publisher.publisher.topic_name}")
        spin(node)
        return 0
    finally:
        if publisher is not None:
            publisher.stop()
        if camera is not None:
            camera.disconnect()
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
