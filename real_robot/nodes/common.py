"""What the nodes of the franka-eval graph share: topic names, QoS, message conversions and typed
parameters. rclpy, its message packages and numpy are imported inside the functions.

Topics (names relative to the node's namespace):

======================== ================================ ===========================================
topic                    type                             what
======================== ================================ ===========================================
camera/color/image_raw   sensor_msgs/Image                rgb8 frames, header stamp = the frame's
joint_states             sensor_msgs/JointState           7 arm joints + ``gripper_width`` (m)
tcp_pose                 geometry_msgs/PoseStamped        the TCP in the robot base frame
action_chunk             std_msgs/Float32MultiArray       [C, 7] twin actions (layout: chunk, action)
action_sent              std_msgs/Float32MultiArray       [7] what the safety layer really sent
ready                    std_msgs/Header                  the bridge is idle: its chunk is done
======================== ================================ ===========================================
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

IMAGE_TOPIC = "camera/color/image_raw"
JOINT_STATES_TOPIC = "joint_states"
TCP_POSE_TOPIC = "tcp_pose"
ACTION_CHUNK_TOPIC = "action_chunk"
ACTION_SENT_TOPIC = "action_sent"
READY_TOPIC = "ready"

ARM_JOINT_NAMES = tuple(f"fr3_joint{i}" for i in range(1, 8))
GRIPPER_WIDTH_NAME = "gripper_width"
JOINT_STATE_NAMES = (*ARM_JOINT_NAMES, GRIPPER_WIDTH_NAME)
"""``JointState.name``: the 7 arm joints (rad), then the distance between the fingers (m)."""
ACTION_DIM = 7
CHUNK_LABELS = ("chunk", "action")
"""The ``layout.dim`` labels of an action chunk ``[C, 7]``."""


class ParameterError(ValueError):
    """A node parameter is missing or has a value of the wrong kind (the message says which)."""


# ----- QoS --------------------------------------------------------------------------------------------

def image_publisher_qos() -> Any:
    """Reliable, newest frame only: both reliable (rviz) and best-effort readers match it."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)


def image_subscriber_qos() -> Any:
    """Reliable, newest only: a reader that wants the current frame, never a backlog. Reliable, not
    best effort: a 640x480 frame (0.9 MB) exceeds Fast DDS's default shared-memory segment and goes
    as UDP fragments, and a best-effort reader loses most frames whose fragments it cannot repair."""
    from rclpy.qos import QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE)


def ready_qos() -> Any:
    """Reliable and latched (transient local, depth 1): a reader that joins late gets the last one."""
    from rclpy.qos import DurabilityPolicy, QoSProfile, ReliabilityPolicy

    return QoSProfile(depth=1, reliability=ReliabilityPolicy.RELIABLE, durability=DurabilityPolicy.TRANSIENT_LOCAL)


# ----- parameters -------------------------------------------------------------------------------------

_KINDS = ("str", "bool", "int", "float", "int_list", "float_list")


def declare_parameters(node: Any, table: dict[str, tuple[str, Any, str]]) -> dict[str, Any]:
    """Declare ``{name: (kind, default, description)}`` on ``node`` and return the checked values.

    Every parameter is declared with dynamic typing and converted here, so that ``-p serial:=1234``
    (an int to YAML) still gives the string a serial is. ``default`` ``...`` makes a parameter
    required; ``None`` means "not set" (lists: also an empty string).

    Raises:
        ParameterError: a required parameter is missing or a value has the wrong kind.
    """
    from rcl_interfaces.msg import ParameterDescriptor
    from rclpy.parameter import Parameter

    values = {}
    for name, (kind, default, description) in table.items():
        if kind not in _KINDS:
            raise ValueError(f"{name}: kind {kind!r}; allowed: {_KINDS}")
        node.declare_parameter(name, None, ParameterDescriptor(dynamic_typing=True, description=description))
        param = node.get_parameter(name)
        raw = None if param.type_ == Parameter.Type.NOT_SET else param.value
        if raw is None:
            if default is ...:
                raise ParameterError(f"{node.get_name()}: the parameter {name!r} is required ({description}); "
                                     f"pass it as --ros-args -p {name}:=...")
            values[name] = default
            continue
        values[name] = _convert(node.get_name(), name, kind, raw)
    return values


def _convert(node_name: str, name: str, kind: str, raw: Any) -> Any:
    def fail() -> ParameterError:
        return ParameterError(f"{node_name}: parameter {name}={raw!r}: expected {kind.replace('_', ' of ')}")

    if kind == "str":
        if isinstance(raw, bool) or not isinstance(raw, (str, int)):
            raise fail()
        return str(raw)
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in ("true", "false"):
            return raw.strip().lower() == "true"
        raise fail()
    if kind == "int":
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise fail()
        return raw
    if kind == "float":
        if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
            raise fail()
        return float(raw)
    # lists: a ROS array, or a string "a,b,c" ("" or "[]": not set)
    items: Sequence[Any]
    if isinstance(raw, str):
        text = raw.strip().strip("[]").strip()
        if not text:
            return None
        try:
            items = [float(v) if kind == "float_list" else int(v) for v in text.split(",")]
        except ValueError:
            raise fail() from None
    elif isinstance(raw, (list, tuple)) or hasattr(raw, "tolist"):
        items = list(raw.tolist() if hasattr(raw, "tolist") else raw)
    else:
        raise fail()
    if kind == "int_list":
        if any(isinstance(v, bool) or not isinstance(v, int) for v in items):
            raise fail()
        return tuple(int(v) for v in items)
    if any(isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) for v in items):
        raise fail()
    return tuple(float(v) for v in items)


# ----- messages ---------------------------------------------------------------------------------------

def stamp_from_seconds(seconds: float) -> Any:
    """A ``builtin_interfaces/Time`` for ``seconds`` since the clock's epoch."""
    from builtin_interfaces.msg import Time

    sec = math.floor(seconds)
    nanosec = min(int(round((seconds - sec) * 1e9)), 999_999_999)
    return Time(sec=int(sec), nanosec=nanosec)


def stamp_seconds(stamp: Any) -> float:
    return stamp.sec + stamp.nanosec * 1e-9


def image_msg(image_rgb: Any, stamp: Any, frame_id: str) -> Any:
    """``sensor_msgs/Image`` (rgb8) of a uint8 ``[H, W, 3]`` RGB array."""
    import numpy as np
    from sensor_msgs.msg import Image

    image = np.ascontiguousarray(image_rgb, dtype=np.uint8)
    if image.ndim != 3 or image.shape[2] != 3:
        raise ValueError(f"an rgb8 image is uint8 [H, W, 3], got {image.shape}")
    msg = Image()
    msg.header.stamp, msg.header.frame_id = stamp, frame_id
    msg.height, msg.width = int(image.shape[0]), int(image.shape[1])
    msg.encoding, msg.is_bigendian, msg.step = "rgb8", 0, int(image.shape[1]) * 3
    msg.data = image.tobytes()
    return msg


def image_from_msg(msg: Any) -> Any:
    """uint8 ``[H, W, 3]`` RGB from an rgb8 or bgr8 ``sensor_msgs/Image``.

    Raises:
        ValueError: another encoding, or a size that does not match the data.
    """
    import numpy as np

    if msg.encoding not in ("rgb8", "bgr8"):
        raise ValueError(f"image encoding {msg.encoding!r}; rgb8 or bgr8 expected")
    h, w, step = int(msg.height), int(msg.width), int(msg.step)
    data = np.frombuffer(bytes(msg.data) if isinstance(msg.data, (list, tuple)) else msg.data, dtype=np.uint8)
    if step < w * 3 or data.size != h * step:
        raise ValueError(f"image {w}x{h} with step {step} does not match its {data.size} bytes")
    image = data.reshape(h, step)[:, :w * 3].reshape(h, w, 3)
    return np.ascontiguousarray(image[..., ::-1] if msg.encoding == "bgr8" else image)


def array_msg(values: Any, labels: Sequence[str]) -> Any:
    """``std_msgs/Float32MultiArray`` of an array, one ``layout.dim`` per axis (row-major strides)."""
    import numpy as np
    from std_msgs.msg import Float32MultiArray, MultiArrayDimension

    arr = np.ascontiguousarray(values, dtype=np.float32)
    if arr.ndim != len(labels):
        raise ValueError(f"{arr.ndim}-D array, {len(labels)} labels {tuple(labels)}")
    msg = Float32MultiArray()
    stride = int(arr.size)
    for label, size in zip(labels, arr.shape):
        msg.layout.dim.append(MultiArrayDimension(label=label, size=int(size), stride=stride))
        stride = stride // max(int(size), 1)
    msg.layout.data_offset = 0
    msg.data = arr.ravel().tolist()
    return msg


def chunk_from_msg(msg: Any) -> Any:
    """float64 ``[C, 7]`` from an action chunk message (NaN kept: the caller decides).

    The layout is ``[C, 7]`` (two dims, the last of size 7, no data offset); an empty layout is
    read as consecutive rows of 7 (what ``ros2 topic pub`` sends without one).

    Raises:
        ValueError: another shape, or data that does not fill it.
    """
    import numpy as np

    data = np.asarray(msg.data, dtype=np.float64)
    dims = [(d.label, int(d.size)) for d in msg.layout.dim]
    if msg.layout.data_offset:
        raise ValueError(f"data_offset={msg.layout.data_offset}; an action chunk starts at 0")
    if not dims:
        if data.size == 0 or data.size % ACTION_DIM:
            raise ValueError(f"{data.size} values without a layout; a chunk is C x {ACTION_DIM}")
        return data.reshape(-1, ACTION_DIM)
    if len(dims) != 2 or dims[1][1] != ACTION_DIM or dims[0][1] < 1:
        raise ValueError(f"layout {dims}; an action chunk is [C, {ACTION_DIM}] with C >= 1")
    if data.size != dims[0][1] * ACTION_DIM:
        raise ValueError(f"layout {dims} needs {dims[0][1] * ACTION_DIM} values, got {data.size}")
    return data.reshape(dims[0][1], ACTION_DIM)


def pose_from_matrix(T: Any) -> Any:
    """``geometry_msgs/Pose`` of a ``[4, 4]`` transform."""
    import numpy as np
    from geometry_msgs.msg import Pose

    from real_robot.transforms import matrix_to_quaternion_wxyz

    T = np.asarray(T, dtype=np.float64)
    w, x, y, z = (float(v) for v in matrix_to_quaternion_wxyz(T[:3, :3]))
    pose = Pose()
    pose.position.x, pose.position.y, pose.position.z = (float(v) for v in T[:3, 3])
    pose.orientation.x, pose.orientation.y, pose.orientation.z, pose.orientation.w = x, y, z, w
    return pose


def matrix_from_pose(pose: Any) -> Any:
    """``[4, 4]`` transform of a ``geometry_msgs/Pose`` (its quaternion normalised)."""
    import numpy as np

    from real_robot.transforms import pose_matrix, quaternion_wxyz_to_matrix

    q = np.array([pose.orientation.w, pose.orientation.x, pose.orientation.y, pose.orientation.z])
    norm = float(np.linalg.norm(q))
    if not math.isfinite(norm) or norm < 1e-6:
        raise ValueError(f"pose orientation {q.tolist()} is not a rotation")
    p = [pose.position.x, pose.position.y, pose.position.z]
    return pose_matrix(p, quaternion_wxyz_to_matrix(q / norm))


# ----- running ----------------------------------------------------------------------------------------

def configure_logging() -> None:
    """Show the Python loggers of ``real_robot`` (the safety layer's clamps, dry-run commands) at INFO
    next to the node's ROS log."""
    import logging

    logging.basicConfig(level=logging.INFO, format="[%(levelname)s] [%(name)s]: %(message)s")


def spin(node: Any, executor: Any = None) -> None:
    """Spin until SIGINT / SIGTERM (rclpy's handlers shut the context down) or ``rclpy.shutdown()``."""
    from rclpy.executors import ExternalShutdownException, SingleThreadedExecutor

    executor = executor or SingleThreadedExecutor()
    executor.add_node(node)
    try:
        executor.spin()
    except (KeyboardInterrupt, ExternalShutdownException):
        pass
    except Exception:
        # a signal that shuts the context down between two waits makes rclpy raise RCLError
        # ("the given context is not valid") instead of ExternalShutdownException
        if node.context.ok():
            raise
    finally:
        executor.remove_node(node)


def safe_publish(node: Any, publisher: Any, msg: Any, on_error: Callable[[], None] | None = None) -> bool:
    """Publish unless the context is shutting down (then a publish raises); False when it did not."""
    try:
        publisher.publish(msg)
        return True
    except Exception:  # noqa: BLE001  the context was shut down under us (SIGTERM)
        if on_error is not None:
            on_error()
        return False
