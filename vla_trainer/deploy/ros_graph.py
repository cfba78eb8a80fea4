"""The franka-eval ROS 2 graph as data: camera -> policy -> bridge, one ``NodeSpec`` each.

::

    camera (real_robot.nodes.camera_node)     --camera/color/image_raw-->  policy
    franka_bridge (real_robot.nodes.bridge_node) --joint_states, tcp_pose, ready-->  policy
    policy (vla_trainer.deploy.ros_policy_node)       --action_chunk-->  franka_bridge  --action_sent-->

``franka_eval_graph(...)`` returns the specs; ``start_nodes(specs, env)`` runs them as
``python -m module --ros-args ...`` processes (what ``franka-eval --ros`` does, no ROS 2 CLI needed)
and ``stop_nodes(procs)`` ends them; ``launch/franka_eval.launch.py`` builds ``launch_ros`` Nodes from
the same specs (``graph_from_launch_arguments``).

Standard library only, and it imports neither the policy nor the env package: ``ros2 launch`` imports
this module in its own Python, which need not have the project's dependencies.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Mapping, Sequence

from real_robot.nodes.common import IMAGE_TOPIC, JOINT_STATES_TOPIC, TCP_POSE_TOPIC
from real_robot.nodes.spec import NodeSpec, local_ros_env, start_nodes, stop_nodes

__all__ = ["LAUNCH_ARGUMENTS", "franka_eval_graph", "graph_from_launch_arguments", "local_ros_env", "start_nodes",
           "stop_nodes"]

CAMERA_MODULE = "real_robot.nodes.camera_node"
BRIDGE_MODULE = "real_robot.nodes.bridge_node"
POLICY_MODULE = "vla_trainer.deploy.ros_policy_node"  # a name only: the policy is loaded in its own process

TWIN_CONTROL_PERIOD_S = 0.2
"""``vla_envs.backends.franka.twin.CONTROL_PERIOD_S`` (a test keeps the two equal)."""
TWIN_REST_JOINT_POSITIONS_RAD = (0.0, 0.3927, 0.0, -1.9635, 0.0, 2.3562, 0.7854)
"""``vla_envs.backends.franka.twin.TWIN_REST_JOINT_POSITIONS_RAD``, where the bridge's ``~/home`` goes:
every twin episode starts there (a test keeps the two equal; copied so that this module needs no numpy)."""
DEFAULT_CAMERA_FILE = Path(__file__).resolve().parents[2] / "vla_envs" / "default_camera.json"
"""The twin's default camera file (read as JSON here, without importing ``vla_envs``)."""

LAUNCH_ARGUMENTS: dict[str, tuple[str | None, str]] = {
    "checkpoint": (None, "model folder, training checkpoint or run folder (as vla-eval --checkpoint)"),
    "robot_ip": ("", "the robot's FCI address, e.g. 172.16.0.2: the bridge drives the arm with franky"),
    "ros_arm_file": ("", "instead of robot_ip, a RosArmConfig YAML: the arm through the robot PC's ROS 2 stack"),
    "instruction": (None, "the task in words, as in training, e.g. 'put carrot on plate'"),
    "camera_serial": ("", "the RealSense serial number"),
    "playback_file": ("", "a .db3 recording instead of the live camera"),
    "camera_crop": ("", "left,top,right,bottom in camera-file pixels; empty: the checkpoint's crop"),
    "camera_file": ("", "the twin's camera file (its resolution is streamed); empty: the default one"),
    "safety_limits_file": ("", "SafetyLimits as YAML or JSON; empty: the conservative defaults"),
    "dry_run": ("false", "true: log every command, move nothing"),
    "home_on_start": ("true", "move to the twin's rest pose once connected, where every twin episode starts "
                              "(as franka-eval --ros does)"),
    "relative_dynamics_factor": ("0.1", "fraction of the arm's max velocity, acceleration and jerk, in (0, 1]"),
    "device": ("cpu", "the policy's torch device, e.g. cuda"),
    "python": ("python3", "the interpreter that runs the nodes: it must import the project and rclpy"),
}
"""``ros2 launch`` arguments: name -> (default, None when required; description)."""


def franka_eval_graph(*, checkpoint: str, instruction: str, robot_ip: str = "", ros_arm_file: str = "",
                      camera_serial: str = "",
                      playback_file: str = "", camera_crop: Sequence[int] | None = None, camera_file: str = "",
                      safety_limits_file: str = "", dry_run: bool = False, relative_dynamics_factor: float = 0.1,
                      ignore_realtime: bool = False, home_on_start: bool = False, camera_fps: int = 30,
                      device: str = "cpu") -> list[NodeSpec]:
    """The camera, policy and bridge nodes of a franka-eval run.

    Args:
        checkpoint: what the policy node loads (``PolicyService``).
        robot_ip: the robot's FCI address (franky-sim: its 127.x address, with ``ignore_realtime``).
        ros_arm_file: instead of ``robot_ip``, a ``RosArmConfig`` YAML: the bridge reaches the arm through
            the robot PC's ROS 2 stack, and the graph's own arm-state topics move under
            ``franka_bridge/`` so that they never mix with the stack's ``/joint_states``.
        instruction: the task in words.
        camera_serial: the RealSense to stream; or ``playback_file``, a ``.db3`` recording.
        camera_crop: ``(left, top, right, bottom)`` in camera-file pixels; None: the checkpoint's.
        camera_file: the twin's camera file; the camera streams its resolution. Empty: the default.
        safety_limits_file: the cell's ``SafetyLimits`` (YAML/JSON); empty: the defaults.
        dry_run: the bridge logs every command and moves nothing.
        relative_dynamics_factor, ignore_realtime: the arm's ``FrankyArmConfig``.
        home_on_start: the bridge moves to the twin's rest pose once connected.
        camera_fps: the live stream's rate.
        device: the policy's torch device.

    Raises:
        ValueError: a required value is missing, both or neither arm or camera source, a bad crop.
    """
    for name, value in (("checkpoint", checkpoint), ("instruction", instruction)):
        if not isinstance(value, str) or not value.strip():
            raise ValueError(f"{name} is required (got {value!r})")
    if bool(robot_ip) == bool(ros_arm_file):
        raise ValueError(f"give robot_ip (franky) or ros_arm_file (the robot's ROS 2 stack), exactly one (got "
                         f"{robot_ip!r}, {ros_arm_file!r})")
    if bool(camera_serial) == bool(playback_file):
        raise ValueError(f"give camera_serial or playback_file, exactly one (got {camera_serial!r}, {playback_file!r})")
    height, width = camera_file_hw(camera_file or DEFAULT_CAMERA_FILE)
    camera = {"width": width, "height": height, "fps": int(camera_fps)}
    camera.update({"serial": str(camera_serial)} if camera_serial else {"playback_file": _path(playback_file)})

    arm = {"robot_ip": robot_ip} if robot_ip else {"ros_arm_file": _path(ros_arm_file)}
    # beside a ROS 2 stack the bridge's state topics must not be the stack's own /joint_states
    state_remaps = (((JOINT_STATES_TOPIC, f"franka_bridge/{JOINT_STATES_TOPIC}"),
                     (TCP_POSE_TOPIC, f"franka_bridge/{TCP_POSE_TOPIC}")) if ros_arm_file else ())
    bridge = {**arm, "ignore_realtime": bool(ignore_realtime),
              "relative_dynamics_factor": float(relative_dynamics_factor), "dry_run": bool(dry_run),
              "home_joint_positions_rad": list(TWIN_REST_JOINT_POSITIONS_RAD), "home_on_start": bool(home_on_start),
              "control_period_s": TWIN_CONTROL_PERIOD_S}
    if safety_limits_file:
        bridge["safety_limits_file"] = _path(safety_limits_file)

    policy = {"checkpoint": _path(checkpoint), "instruction": instruction, "device": device,
              "control_period_s": TWIN_CONTROL_PERIOD_S}
    if camera_crop is not None:
        crop = [int(v) for v in camera_crop]
        if len(crop) != 4 or not (0 <= crop[0] < crop[2] <= width and 0 <= crop[1] < crop[3] <= height):
            raise ValueError(f"camera_crop={list(camera_crop)}: left, top, right, bottom with 0 <= left < right <= "
                             f"{width} and 0 <= top < bottom <= {height} (the camera file's pixels)")
        policy["camera_crop"] = crop
    if camera_file:
        policy["camera_file"] = _path(camera_file)
    return [
        NodeSpec("camera", CAMERA_MODULE, camera, description="RealSense -> sensor_msgs/Image"),
        NodeSpec("policy", POLICY_MODULE, policy, remappings=(("image", IMAGE_TOPIC), *state_remaps),
                 description="twin observation -> PolicyService -> action_chunk"),
        NodeSpec("franka_bridge", BRIDGE_MODULE, bridge, remappings=state_remaps,
                 description=f"action_chunk -> SafetyLayer -> {'FrankyArm' if robot_ip else 'RosArm'}; arm state out"),
    ]


def graph_from_launch_arguments(values: Mapping[str, str]) -> list[NodeSpec]:
    """``franka_eval_graph`` from ``ros2 launch`` argument strings (``LAUNCH_ARGUMENTS``; ``python``
    is not a graph value and is ignored here).

    Raises:
        ValueError: an unknown argument, a required one missing, or a value that does not parse.
    """
    unknown = sorted(set(values) - set(LAUNCH_ARGUMENTS))
    if unknown:
        raise ValueError(f"unknown launch argument(s) {unknown}; allowed: {sorted(LAUNCH_ARGUMENTS)}")
    get = {name: values.get(name, default) for name, (default, _) in LAUNCH_ARGUMENTS.items()}
    crop_text = (get["camera_crop"] or "").strip().strip("[]()").strip()
    try:
        crop = [int(v) for v in crop_text.split(",")] if crop_text else None
    except ValueError:
        raise ValueError(f"camera_crop:={get['camera_crop']!r}: left,top,right,bottom (integers)") from None
    try:
        speed = float(get["relative_dynamics_factor"])
    except ValueError:
        speed = float("nan")
    if not 0.0 < speed <= 1.0:
        raise ValueError(f"relative_dynamics_factor:={get['relative_dynamics_factor']!r}: a number in (0, 1]")
    return franka_eval_graph(checkpoint=get["checkpoint"] or "", robot_ip=get["robot_ip"] or "",
                             ros_arm_file=get["ros_arm_file"] or "",
                             instruction=get["instruction"] or "", camera_serial=get["camera_serial"] or "",
                             playback_file=get["playback_file"] or "", camera_crop=crop,
                             camera_file=get["camera_file"] or "", safety_limits_file=get["safety_limits_file"] or "",
                             dry_run=_parse_bool("dry_run", get["dry_run"] or "false"),
                             home_on_start=_parse_bool("home_on_start", get["home_on_start"] or "true"),
                             relative_dynamics_factor=speed, device=get["device"] or "cpu")


def camera_file_hw(path: str | Path) -> tuple[int, int]:
    """``(height, width)`` of a camera file (``vla_envs.camera_file`` checks the rest)."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"camera file {path} is a folder, not a file")
    try:
        data = json.loads(path.read_bytes())
        height, width = data["height"], data["width"]
    except FileNotFoundError:
        raise ValueError(f"camera file {path} does not exist") from None
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise ValueError(f"camera file {path}: a JSON object with integer 'width' and 'height'") from None
    if not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in (height, width)):
        raise ValueError(f"camera file {path}: 'width' and 'height' are positive integers")
    return height, width


def _parse_bool(name: str, text: str) -> bool:
    value = text.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"{name}:={text!r}: true or false")


def _path(value: str) -> str:
    """An absolute path when it names something here (the nodes may run elsewhere in the tree)."""
    path = Path(value).expanduser()
    return str(path.resolve()) if path.exists() else str(value)
