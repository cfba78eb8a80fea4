"""ROS 2 policy node: a checkpoint acting on the real robot through the bridge's topics, with the
Panda twin's observation and action (``vla_envs.backends.franka.twin``).

    python -m vla_trainer.deploy.ros_policy_node --ros-args -r __node:=policy -p checkpoint:='warm_start/...' \\
        -p instruction:='put carrot on plate' -r image:=camera/color/image_raw

Subscribes ``image`` (``sensor_msgs/Image``, remapped to the camera's topic), ``joint_states`` and
``tcp_pose`` (the bridge's raw state, paired by header stamp), ``ready`` (the bridge is idle) and
``action_sent`` (the bridge executed an action); publishes ``action_chunk``
(``std_msgs/Float32MultiArray`` [C, 7], layout ``chunk`` x ``action``).

Before it subscribes, the node checks the checkpoint against the env as ``franka-eval`` does
(``vla_trainer.deploy.fit.check_fit``: image size, camera crop, state layout, action convention,
e.g. it refuses a LIBERO-trained checkpoint) and exits with status 2 naming both sides.

Pacing: one policy call per ``ready`` from the bridge. The bridge sends ``ready`` when the last action
of a chunk has run and its control period is over (and once at start, latched). The node then waits
for an image received after that ``ready`` and an arm state stamped after it (so the policy sees the
arm at rest where the chunk left it), calls the policy, converts every action with
``twin_scaled_action`` and publishes the chunk. The next call waits for the next ``ready``; if none
comes within ``ready_timeout_s`` of the bridge's last sign of progress (the chunk's publication plus
``chunk_size * control_period_s``, or a later ``action_sent``: a slow arm is still executing, and a
chunk is never cut by this) the node warns (a lost message, a bridge that dropped the chunk) and
acts on the next fresh observation anyway. So the robot runs
chunk, pause of one policy call (~0.1 s on a CPU for the tiny model), chunk, ...; no chunk ever
cuts into the previous one.

Parameters: ``checkpoint`` (required), ``instruction`` (required), ``camera_crop`` (``[left, top,
right, bottom]`` in pixels of the camera file; unset: the checkpoint's), ``camera_file`` (its
``(height, width)`` is the resolution frames must have; unset: the default camera file) or
``camera_hw`` (``[height, width]``, instead of a file), ``device``, ``control_period_s``,
``ready_timeout_s``, ``max_image_age_s`` (an older image is not acted on).
"""

from __future__ import annotations

import sys
import time
from typing import Any

PARAMETERS = {
    "checkpoint": ("str", ..., "model folder, training checkpoint or run folder (as vla-eval --checkpoint)"),
    "instruction": ("str", ..., "the task in words, as in training"),
    "camera_crop": ("int_list", None, "[left, top, right, bottom] in camera-file pixels; unset: the checkpoint's"),
    "camera_file": ("str", "", "the twin's camera file; empty: the default one"),
    "camera_hw": ("int_list", None, "[height, width] of the frames, instead of a camera file"),
    "device": ("str", "cpu", "torch device of the model"),
    "control_period_s": ("float", 0.2, "seconds per action (the bridge's control period)"),
    "ready_timeout_s": ("float", 2.0, "act anyway when no ready comes this long after the chunk's duration "
                                      "and the bridge's last executed action"),
    "max_image_age_s": ("float", 0.5, "do not act on an image received longer ago than this"),
}
TICK_S = 0.02
"""How often the node checks whether it can act."""


class PolicyNode:
    """The pacing and the twin conversion around a ``PolicyService``-like object with ``act``/``spec``."""

    def __init__(self, node: Any, policy: Any, *, instruction: str, camera_crop: tuple[int, int, int, int] | None,
                 camera_hw: tuple[int, int] | None, control_period_s: float, ready_timeout_s: float,
                 max_image_age_s: float, undistort: Any = None):
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, Header

        from real_robot.nodes import common

        if not instruction.strip():
            raise ValueError("instruction: the task in words, e.g. 'put carrot on plate'")
        self.node, self.policy, self.instruction = node, policy, instruction
        self.camera_crop, self.camera_hw, self.undistort = camera_crop, camera_hw, undistort
        self.spec = policy.spec
        self.chunk_duration_s = self.spec.chunk_size * control_period_s
        self.ready_timeout_s, self.max_image_age_s = ready_timeout_s, max_image_age_s
        self.log = node.get_logger()

        self._image: tuple[float, Any] | None = None  # (received monotonic s, msg)
        self._joints: dict[tuple[int, int], Any] = {}  # stamp -> JointState, paired with a pose of that stamp
        self._state: tuple[float, Any, Any] | None = None  # (stamp s, JointState, PoseStamped)
        self._ready: tuple[float, float] | None = None  # (received monotonic s, stamp s) not yet acted on
        self._published_s: float | None = None
        self._last_sent_s = -float("inf")  # monotonic s of the bridge's last action_sent
        self.chunks_published = 0
        self.last_call_s = 0.0

        node.create_subscription(Image, "image", self._on_image, common.image_subscriber_qos())
        node.create_subscription(JointState, common.JOINT_STATES_TOPIC, self._on_joints, 10)
        node.create_subscription(PoseStamped, common.TCP_POSE_TOPIC, self._on_pose, 10)
        node.create_subscription(Header, common.READY_TOPIC, self._on_ready, common.ready_qos())
        node.create_subscription(Float32MultiArray, common.ACTION_SENT_TOPIC, self._on_sent, 10)
        self.chunk_pub = node.create_publisher(Float32MultiArray, common.ACTION_CHUNK_TOPIC, 10)
        node.create_timer(TICK_S, self._tick)

    # ----- inputs -------------------------------------------------------------------------------
    def _on_image(self, msg: Any) -> None:
        self._image = (time.monotonic(), msg)

    def _on_joints(self, msg: Any) -> None:
        key = (msg.header.stamp.sec, msg.header.stamp.nanosec)
        self._joints[key] = msg
        while len(self._joints) > 20:
            self._joints.pop(next(iter(self._joints)))

    def _on_pose(self, msg: Any) -> None:
        from real_robot.nodes.common import stamp_seconds

        joints = self._joints.pop((msg.header.stamp.sec, msg.header.stamp.nanosec), None)
        if joints is not None:
            self._state = (stamp_seconds(msg.header.stamp), joints, msg)

    def _on_ready(self, msg: Any) -> None:
        from real_robot.nodes.common import stamp_seconds

        self._ready = (time.monotonic(), stamp_seconds(msg.stamp))

    def _on_sent(self, msg: Any) -> None:
        self._last_sent_s = time.monotonic()

    # ----- acting -------------------------------------------------------------------------------
    def _tick(self) -> None:
        now = time.monotonic()
        if self._ready is None:
            if self._published_s is None:
                return
            progress_s = max(self._published_s + self.chunk_duration_s, self._last_sent_s)
            if now - progress_s < self.ready_timeout_s:
                return
            self.log.warning(f"no ready from the bridge within {self.ready_timeout_s:.1f} s of the chunk's duration "
                             f"and its last executed action; acting on the next fresh observation",
                             throttle_duration_sec=10.0)
            self._ready = (now, -1.0)
        ready_s, ready_stamp_s = self._ready
        if self._image is None or self._image[0] < ready_s:
            return  # an image from after the ready: the arm at rest
        if now - self._image[0] > self.max_image_age_s:
            self.log.warning(f"the newest image is {now - self._image[0]:.2f} s old; waiting for the camera",
                             throttle_duration_sec=5.0)
            return
        if self.spec.state_dim and (self._state is None or self._state[0] < ready_stamp_s):
            return
        try:
            chunk = self.act()
        except Exception as e:  # noqa: BLE001  a bad frame or state: report, wait for the next ready
            self.log.error(f"policy call failed: {e}", throttle_duration_sec=5.0)
            self._ready, self._published_s = None, now
            return
        from real_robot.nodes.common import CHUNK_LABELS, array_msg, safe_publish

        if safe_publish(self.node, self.chunk_pub, array_msg(chunk, CHUNK_LABELS)):
            self.chunks_published += 1
        self._ready, self._published_s = None, time.monotonic()

    def act(self) -> Any:
        """One chunk float32 ``[C, 7]`` for the newest image and state, each action scaled for the real arm."""
        import numpy as np

        from real_robot.nodes.common import image_from_msg, matrix_from_pose
        from vla_envs.backends.franka.twin import twin_image, twin_scaled_action, twin_state

        assert self._image is not None
        image = twin_image(image_from_msg(self._image[1]), self.spec.image_size, self.camera_crop, self.camera_hw,
                           self.undistort)
        state = None
        if self.spec.state_dim:
            assert self._state is not None
            _, joints, pose = self._state
            positions = np.asarray(joints.position, dtype=np.float64)
            if positions.shape != (8,):
                raise ValueError(f"joint_states has {positions.size} positions; 7 joints and the gripper width "
                                 f"expected")
            state = twin_state(positions[:7], float(positions[7]), matrix_from_pose(pose.pose))
            if state.shape != (self.spec.state_dim,):
                raise ValueError(f"the twin's state has {state.shape[0]} values, the checkpoint reads "
                                 f"{self.spec.state_dim}")
        start_s = time.monotonic()
        actions = np.asarray(self.policy.act(image, self.instruction, state), dtype=np.float32)
        self.last_call_s = time.monotonic() - start_s
        if actions.ndim != 2 or actions.shape[1] != 7:
            raise ValueError(f"the policy returned actions of shape {actions.shape}; [C, 7] expected")
        return np.stack([twin_scaled_action(a) for a in actions])


def resolve_camera(camera_crop: tuple[int, ...] | None, camera_file: str, camera_hw: tuple[int, ...] | None,
                   checkpoint_crop: tuple[int, int, int, int] | None):
    """``(camera_crop, camera_hw, undistort)`` for ``twin_image``: the crop given or the checkpoint's,
    checked against the camera file's resolution (or ``camera_hw`` when given instead), and the camera
    file's ``undistorter()`` (None with ``camera_hw``: no lens is known).

    Raises:
        ValueError: a crop or size of the wrong length, or a crop outside the frame.
    """
    crop = tuple(camera_crop) if camera_crop is not None else checkpoint_crop
    if crop is not None and len(crop) != 4:
        raise ValueError(f"camera_crop={list(crop)}: [left, top, right, bottom]")
    if camera_hw is not None:
        if camera_file:
            raise ValueError("give camera_file or camera_hw, not both")
        if len(camera_hw) != 2 or min(camera_hw) <= 0:
            raise ValueError(f"camera_hw={list(camera_hw)}: [height, width], positive")
        hw = (int(camera_hw[0]), int(camera_hw[1]))
        if crop is not None:
            left, top, right, bottom = crop
            if not (0 <= left < right <= hw[1] and 0 <= top < bottom <= hw[0]):
                raise ValueError(f"camera_crop {list(crop)} does not fit a {hw[1]}x{hw[0]} frame")
        return crop, hw, None
    from vla_envs.camera_file import load_camera_file

    cam = load_camera_file(camera_file or None)
    crop = None if crop is None else cam.check_crop(crop)
    return crop, (cam.height, cam.width), cam.undistorter()


def main(argv: list[str] | None = None) -> int:
    from real_robot.errors import require_module

    rclpy = require_module("rclpy", extra="ros")
    from real_robot.nodes.common import ParameterError, configure_logging, declare_parameters, spin

    configure_logging()
    rclpy.init(args=sys.argv if argv is None else argv)
    node = rclpy.create_node("policy")
    log = node.get_logger()
    try:
        try:
            p = declare_parameters(node, PARAMETERS)
            from vla_envs.backends.franka.twin import STATE_DIM
            from vla_trainer.deploy.fit import check_fit
            from vla_trainer.deploy.serve import PolicyService

            start_s = time.monotonic()
            policy = PolicyService(p["checkpoint"], device=p["device"])
            crop, hw, undistort = resolve_camera(p["camera_crop"], p["camera_file"], p["camera_hw"],
                                                 policy.spec.camera_crop)
            check_fit(policy.spec, image_size=None, state_dim=STATE_DIM, camera_hw=hw,
                      camera_crop=None if p["camera_crop"] is None else tuple(p["camera_crop"]))
            PolicyNode(node, policy, instruction=p["instruction"], camera_crop=crop, camera_hw=hw,
                       control_period_s=p["control_period_s"], ready_timeout_s=p["ready_timeout_s"],
                       max_image_age_s=p["max_image_age_s"], undistort=undistort)
        except (ParameterError, ValueError, FileNotFoundError) as e:
            log.fatal(str(e))
            return 2
        except Exception as e:  # noqa: BLE001  a checkpoint that does not load: say so and exit
            log.fatal(f"loading {p['checkpoint']} failed: {e!r}")
            return 1
        spec = policy.spec
        log.info(f"loaded {spec.model_dir} in {time.monotonic() - start_s:.1f} s: image {spec.image_size}, state "
                 f"{spec.state_dim}, chunks of {spec.chunk_size}; frames {hw[1]}x{hw[0]}, crop {crop}; "
                 f"instruction {p['instruction']!r}")
        spin(node)
        return 0
    finally:
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
