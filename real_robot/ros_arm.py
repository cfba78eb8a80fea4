"""A Franka driven through ROS 2 (``pip install "vla-rl[ros]"``): for robot PCs where a franka_ros2
stack (or another ros2_control stack) already owns the arm, so that franky cannot connect to it.

The arm is reached through standard messages only, so nothing but rclpy and the message packages on
PyPI is needed on the policy side:

=================================== ==================================== ================================
what                                type                                 default name (franka_ros2)
=================================== ==================================== ================================
arm and finger joints (read)        sensor_msgs/JointState               /joint_states
TCP pose in the base frame (read)   geometry_msgs/PoseStamped            /franka_robot_state_broadcaster/current_pose
Cartesian target (written)          geometry_msgs/PoseStamped            /cartesian_impedance_controller/target_pose
homing (written)                    trajectory_msgs/JointTrajectory      /fr3_arm_controller/joint_trajectory
gripper                             see ``GRIPPER_INTERFACES``           /fr3_gripper/...
error recovery                      franka_msgs/action/ErrorRecovery     /action_server/error_recovery
=================================== ==================================== ================================

The Cartesian target goes to whatever controller the stack runs for it (a Cartesian impedance or
pose controller that tracks a ``PoseStamped`` target); the ``SafetyLayer`` computes every target
from the measured pose, as with franky, so the controller only ever sees checked poses. The TCP pose
topic must be the pose of the TCP between the fingertips (libfranka's ``O_T_EE`` with the Franka
Hand's default end effector, what franka_robot_state_broadcaster publishes), the twin's
``panda_hand_tcp``.

Message types that are not on PyPI (``franka_msgs``, ``control_msgs``) are imported by name when the
arm connects, from the robot PC's sourced ROS workspace; an arm configured without them (gripper
``set_bool`` or ``none``, no error recovery action) needs none.
"""

from __future__ import annotations

import importlib
import logging
import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from real_robot.arm import NUM_JOINTS, Arm, ArmObservation, now_s
from real_robot.errors import MotionError, RealRobotError, RobotUnreachableError, require_module
from real_robot.lifecycle import requires_connection, requires_no_connection

logger = logging.getLogger(__name__)

GRIPPER_INTERFACES = {
    "franka_msgs": "franka_gripper's actions <gripper_namespace>/grasp (franka_msgs/action/Grasp) to close "
                   "and <gripper_namespace>/move (franka_msgs/action/Move) to open",
    "gripper_command": "<gripper_namespace>/gripper_action (control_msgs/action/GripperCommand; position = "
                       "one finger's opening, half the width)",
    "set_bool": "the service <gripper_namespace>/close (std_srvs/srv/SetBool; data true closes), for grippers "
                "wrapped by a lab's own node",
    "none": "no gripper: gripper commands are ignored and the width reads NaN",
}
"""How the gripper is driven, by the name given in ``RosArmConfig.gripper``."""

ROTATION_RADIUS_M = 0.1
"""Pose distances add translation and rotation as ``|dp| + ROTATION_RADIUS_M * angle`` (a point 10 cm
from the TCP, about the fingertips' reach)."""
ARRIVED_M = 0.002
"""A waited-for Cartesian step has arrived when the measured TCP is this close to its target..."""
MOVED_M = 0.001
AT_REST_M = 2e-4
"""...or when, having come at least ``MOVED_M`` nearer its target than it started, two readings
``AT_REST_INTERVAL_S`` apart differ by less than this. Nearer, not merely away from the start: the
last millimetres of the previous step, sideways to this one, are not this step having begun (a
step that returned on them was replaced by the next before it started, and lost)."""
AT_REST_INTERVAL_S = 0.03
HOME_TOLERANCE_RAD = 0.01
HOME_AT_REST_RAD = 2e-4
"""A joint move has arrived when every joint is within ``HOME_TOLERANCE_RAD`` of its target and moved
less than ``HOME_AT_REST_RAD`` in the last ``AT_REST_INTERVAL_S``."""
FRANKA_MAX_JOINT_SPEED_RAD_PER_S = 2.1
"""The slowest joint's limit of FR3 and Panda (joints 5-7 are faster): homing lasts long enough for it."""


@dataclass(kw_only=True)
class RosArmConfig:
    """Where a ROS 2 stack publishes the arm's state and takes its commands. Topic and action names
    are resolved like any ROS name (relative names under ``namespace``)."""

    namespace: str = ""
    """Prefix of every relative name below (e.g. ``"fr3"`` for a namespaced stack)."""
    joint_states_topic: str = "/joint_states"
    """``sensor_msgs/JointState`` with the arm joints (and the fingers, when the gripper is loaded)."""
    arm_joint_names: tuple[str, ...] = tuple(f"fr3_joint{i}" for i in range(1, NUM_JOINTS + 1))
    """The 7 arm joints in base-to-flange order (a Panda stack: ``panda_joint1`` ...)."""
    finger_joint_names: tuple[str, ...] = ("fr3_finger_joint1", "fr3_finger_joint2")
    """The finger joints; their positions sum to the gripper width. Empty: no width is read (NaN)."""
    finger_joint_states_topic: str = ""
    """``sensor_msgs/JointState`` with the finger joints when ``joint_states_topic`` lacks them (the
    gripper node's own, e.g. ``/fr3_gripper/joint_states``); empty: ``joint_states_topic``."""
    tcp_pose_topic: str = "/franka_robot_state_broadcaster/current_pose"
    """``geometry_msgs/PoseStamped``: the TCP in the robot base frame."""
    target_pose_topic: str = "/cartesian_impedance_controller/target_pose"
    """``geometry_msgs/PoseStamped`` the Cartesian controller tracks (absolute TCP pose, base frame)."""
    base_frame: str = "base"
    """``header.frame_id`` of the targets sent (the frame the TCP pose topic is in)."""
    joint_trajectory_topic: str = "/fr3_arm_controller/joint_trajectory"
    """``trajectory_msgs/JointTrajectory`` of a joint trajectory controller, for homing. Empty: homing
    is refused with an error (home the arm with the stack's own tools)."""
    gripper: str = "franka_msgs"
    """How the gripper is driven: a key of ``GRIPPER_INTERFACES``."""
    gripper_namespace: str = "/fr3_gripper"
    """Where the gripper's actions or service live."""
    gripper_speed_m_per_s: float = 0.05
    grasp_force_n: float = 20.0
    error_recovery_action: str = "/action_server/error_recovery"
    """``franka_msgs/action/ErrorRecovery`` that ``recover()`` calls; empty: ``recover()`` only
    reports whether the state streams."""
    relative_dynamics_factor: float = 0.1
    """The fraction of the arm's maximum velocity its controller is set up to move with, in (0, 1].
    The controller decides the speed; this declares it so that the SafetyLayer can check it, and
    paces homing."""
    connect_timeout_s: float = 5.0
    """Give up when the state topics have not both delivered a message within this long (DDS
    discovery alone takes seconds)."""
    state_timeout_s: float = 0.25
    """A joint state or TCP pose older than this is refused: nothing is sent on a stale state."""
    wait_for_motion: bool = True
    """True: a Cartesian step returns once the TCP has arrived (or come to rest); False: at once."""
    settle_timeout_s: float = 1.0
    """Wait at most this long for a step to arrive."""
    domain_id: int | None = None
    """DDS domain; None: ``ROS_DOMAIN_ID`` of the environment."""

    def __post_init__(self) -> None:
        if self.gripper not in GRIPPER_INTERFACES:
            raise ValueError(f"gripper={self.gripper!r}; allowed: {', '.join(GRIPPER_INTERFACES)}")
        for name in ("arm_joint_names", "finger_joint_names"):
            names = getattr(self, name)
            if not (isinstance(names, (list, tuple)) and all(isinstance(n, str) for n in names)):
                raise ValueError(f"{name}={names!r}: a list of joint names")
            setattr(self, name, tuple(names))
        if len(self.arm_joint_names) != NUM_JOINTS:
            raise ValueError(f"arm_joint_names has {len(self.arm_joint_names)} names; the arm has {NUM_JOINTS} joints")
        for name, value, hi in (("relative_dynamics_factor", self.relative_dynamics_factor, 1.0),
                                ("connect_timeout_s", self.connect_timeout_s, 120.0),
                                ("state_timeout_s", self.state_timeout_s, 5.0),
                                ("settle_timeout_s", self.settle_timeout_s, 10.0),
                                ("gripper_speed_m_per_s", self.gripper_speed_m_per_s, 0.2),
                                ("grasp_force_n", self.grasp_force_n, 140.0)):
            if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= hi):
                raise ValueError(f"{name}={value!r}: a number in (0, {hi:g}]")
        if self.domain_id is not None and not (isinstance(self.domain_id, int) and not isinstance(self.domain_id, bool)
                                               and 0 <= self.domain_id <= 232):
            raise ValueError(f"domain_id={self.domain_id!r}: an integer in [0, 232] or None")

    @classmethod
    def from_file(cls, path: str | Path) -> "RosArmConfig":
        """Read the fields from a YAML (or JSON) mapping; unknown keys are refused by name.

        Raises:
            FileNotFoundError: no such file.
            ValueError: a folder, a file that is not a YAML/JSON mapping, an unknown field or a bad value.
        """
        import dataclasses

        from real_robot.config_file import read_mapping_file

        data = read_mapping_file(path, "RosArmConfig fields")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known, key=str)
        if unknown:
            raise ValueError(f"{path}: unknown RosArmConfig field(s) {unknown}; allowed: {sorted(known)}")
        return cls(**data)


def _pose_distance(T_a: Any, T_b: Any) -> float:
    import numpy as np

    from real_robot.transforms import rotation_angle

    return float(np.linalg.norm(T_a[:3, 3] - T_b[:3, 3]) + ROTATION_RADIUS_M * rotation_angle(T_a[:3, :3].T @ T_b[:3, :3]))


def _import_type(dotted: str, what: str) -> Any:
    """``franka_msgs.action.Grasp`` from the sourced ROS workspace, or an error saying how to get it."""
    package, _, name = dotted.rpartition(".")
    try:
        return getattr(importlib.import_module(package), name)
    except (ImportError, AttributeError) as e:
        raise RealRobotError(
            f"{what} needs the ROS message type {dotted}, which is not importable ({e}); source the robot PC's ROS "
            f"workspace (it is not on PyPI), or configure the arm without it") from e


def _succeeded(answer: Any) -> bool:
    """Whether a command's final answer reports success: an action's status (a refused goal's handle
    has status unknown), a service's ``success``."""
    if hasattr(answer, "status"):
        from action_msgs.msg import GoalStatus

        return answer.status == GoalStatus.STATUS_SUCCEEDED
    return bool(getattr(answer, "success", True))


class RosArm(Arm):
    """A Franka arm and its gripper behind a ROS 2 stack. Move it only through a ``SafetyLayer``."""

    def __init__(self, config: RosArmConfig):
        super().__init__()
        self.config = config
        self._context: Any = None
        self._node: Any = None
        self._executor: Any = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        # (message or value, monotonic receipt time) of the newest of each
        self._joints: tuple[Any, float] | None = None
        self._fingers: tuple[float, float] | None = None
        self._pose: tuple[Any, float] | None = None
        self._gripper_call: dict[str, Any] = {}  # server name -> action or service client, once connected
        self._gripper_future: Any = None
        self._gripper_closing = False  # what the command in _gripper_future asked for
        self._motion: Callable[[], None] | None = None  # waits for the motion just started (_finish_motion)
        self._warned_settle = False  # one warning for steps that time out; the rest at debug level

    def __repr__(self) -> str:
        return f"RosArm({self.config.namespace or '/'}: {self.config.target_pose_topic})"

    @property
    def relative_dynamics_factor(self) -> float:
        return float(self.config.relative_dynamics_factor)

    @property
    def is_connected(self) -> bool:
        return self._node is not None

    # ----- lifecycle ---------------------------------------------------------------------------------
    @requires_no_connection
    def connect(self, timeout_s: float | None = None) -> None:
        """Join the ROS graph and wait for the arm's state (and the gripper and recovery servers).

        Raises:
            RobotUnreachableError: a state topic delivered nothing, or a server did not appear, within
                the deadline (the message names it and who publishes the topic).
            RealRobotError: a message type of the configured gripper or recovery is not importable.
            MissingExtraError: rclpy or the standard message packages are not installed.
        """
        rclpy = require_module("rclpy", extra="ros")
        from geometry_msgs.msg import PoseStamped
        from rclpy.executors import SingleThreadedExecutor
        from rclpy.qos import qos_profile_sensor_data
        from sensor_msgs.msg import JointState

        c = self.config
        deadline_s = time.monotonic() + (c.connect_timeout_s if timeout_s is None else float(timeout_s))
        # types by name first: a missing package is a configuration error, found before any waiting
        gripper_type = {"franka_msgs": "franka_msgs.action.Grasp", "gripper_command": "control_msgs.action.GripperCommand",
                        "set_bool": "std_srvs.srv.SetBool"}.get(c.gripper)
        gripper_types = [_import_type(gripper_type, f"gripper={c.gripper!r}")] if gripper_type else []
        if c.gripper == "franka_msgs":
            gripper_types.append(_import_type("franka_msgs.action.Move", "gripper='franka_msgs'"))
        recovery_type = (_import_type("franka_msgs.action.ErrorRecovery", "error_recovery_action")
                         if c.error_recovery_action else None)

        self._context = rclpy.Context()
        # no signal handlers: the process that owns the arm decides what Ctrl-C does; no arguments: the
        # process's own --ros-args (a bridge node's name and remaps) must not rename the arm's topics
        rclpy.init(args=[], context=self._context, domain_id=c.domain_id,
                   signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
        try:
            self._node = rclpy.create_node("vla_ros_arm", namespace=c.namespace or None, context=self._context)
            node = self._node
            node.create_subscription(JointState, c.joint_states_topic, self._on_joints, qos_profile_sensor_data)
            if c.finger_joint_names and c.finger_joint_states_topic not in ("", c.joint_states_topic):
                node.create_subscription(JointState, c.finger_joint_states_topic, self._on_joints,
                                         qos_profile_sensor_data)
            node.create_subscription(PoseStamped, c.tcp_pose_topic, self._on_pose, qos_profile_sensor_data)
            self._target_pub = node.create_publisher(PoseStamped, c.target_pose_topic, 10)
            self._trajectory_pub = None
            if c.joint_trajectory_topic:
                from trajectory_msgs.msg import JointTrajectory

                self._trajectory_pub = node.create_publisher(JointTrajectory, c.joint_trajectory_topic, 10)
            self._gripper_call = self._gripper_clients(gripper_types)
            self._recovery = None
            if recovery_type is not None:
                from rclpy.action import ActionClient

                self._recovery = ActionClient(node, recovery_type, c.error_recovery_action)
            # spin only once every entity exists: an action client created while the executor spins
            # can be polled half-built, which ends the spin thread (the state then never arrives)
            self._executor = SingleThreadedExecutor(context=self._context)
            self._executor.add_node(node)
            self._thread = threading.Thread(target=self._spin, name="ros-arm", daemon=True)
            self._thread.start()
            self._wait_for_graph(deadline_s)
        except BaseException:
            self._shutdown()
            raise

    def _spin(self) -> None:
        try:
            self._executor.spin()
        except Exception:
            # disconnect() ends the thread this way, shutting the context down under it; anything else
            # leaves the arm without state (every read then fails as stale): say why
            context = self._context
            if context is not None and context.ok():
                logger.exception("%s: its ROS executor stopped; no state arrives from now on", self)

    def _gripper_clients(self, types: list[Any]) -> Any:
        from rclpy.action import ActionClient

        c, node = self.config, self._node
        ns = c.gripper_namespace.rstrip("/")
        if c.gripper == "franka_msgs":
            grasp, move = types
            return {f"{ns}/grasp": ActionClient(node, grasp, f"{ns}/grasp"),
                    f"{ns}/move": ActionClient(node, move, f"{ns}/move")}
        if c.gripper == "gripper_command":
            return {f"{ns}/gripper_action": ActionClient(node, types[0], f"{ns}/gripper_action")}
        if c.gripper == "set_bool":
            return {f"{ns}/close": node.create_client(types[0], f"{ns}/close")}
        return {}

    def _wait_for_graph(self, deadline_s: float) -> None:
        c = self.config

        def not_arrived() -> list[tuple[str, str]]:
            """(topic, what) of each state not received yet."""
            wanted = [(c.joint_states_topic, "the arm joints", self._joints), (c.tcp_pose_topic, "the TCP pose", self._pose)]
            if c.finger_joint_names:
                wanted.append((c.finger_joint_states_topic or c.joint_states_topic,
                               f"the fingers {', '.join(c.finger_joint_names)}", self._fingers))
            return [(topic, what) for topic, what, got in wanted if got is None]

        while time.monotonic() < deadline_s and not_arrived():
            time.sleep(0.01)
        missing = not_arrived()
        if missing:
            detail = "; ".join(f"{what} on {topic} ({self._node.count_publishers(topic)} publishers seen)"
                               for topic, what in missing)
            raise RobotUnreachableError(
                f"no arm state within connect_timeout_s={c.connect_timeout_s:g} s: nothing arrived for {detail}. Is the "
                f"robot's ROS 2 stack running with the same ROS_DOMAIN_ID, and are the names those of RosArmConfig?")
        servers = dict(self._gripper_call)
        if self._recovery is not None:
            servers[c.error_recovery_action] = self._recovery
        for name, client in servers.items():
            # an action client or a service client
            ready = client.server_is_ready if hasattr(client, "server_is_ready") else client.service_is_ready
            while not ready() and time.monotonic() < deadline_s:
                time.sleep(0.01)
            if not ready():
                raise RobotUnreachableError(f"the server {name} did not appear within connect_timeout_s="
                                            f"{c.connect_timeout_s:g} s; is the robot stack's gripper / recovery running?")

    def _on_joints(self, msg: Any) -> None:
        # franka_ros2's /joint_states joins arm and fingers in one message; a gripper node publishes the
        # fingers alone: take from each message what it holds
        now, names = time.monotonic(), set(msg.name)
        fingers = self.config.finger_joint_names
        with self._lock:
            if set(self.config.arm_joint_names) <= names:
                self._joints = (msg, now)
            if fingers and set(fingers) <= names:
                index = {name: i for i, name in enumerate(msg.name)}
                self._fingers = (float(sum(msg.position[index[n]] for n in fingers)), now)

    def _on_pose(self, msg: Any) -> None:
        with self._lock:
            self._pose = (msg, time.monotonic())

    def disconnect(self) -> None:
        if self._node is None:
            return
        try:
            self.stop()
            self._wait_gripper()
        finally:
            self._shutdown()

    def _shutdown(self) -> None:
        import rclpy

        if self._executor is not None:
            self._executor.shutdown(timeout_sec=1.0)
        if self._node is not None:
            self._node.destroy_node()
        if self._context is not None and self._context.ok():
            rclpy.shutdown(context=self._context)
        if self._thread is not None:
            self._thread.join(2.0)
        self._node = self._executor = self._context = self._thread = None
        self._joints = self._fingers = self._pose = self._gripper_future = self._gripper_kept = None
        self._gripper_call = {}

    # ----- reading -------------------------------------------------------------------------------------
    @requires_connection
    def observation(self) -> ArmObservation:
        """The newest joint state, finger width and TCP pose.

        Raises:
            StaleStateError: one of them is older than ``state_timeout_s`` (the stack stopped publishing).
            InvalidStateError: the TCP pose is not one (a zero quaternion), or a value is not finite.
        """
        import numpy as np

        from real_robot.transforms import pose_matrix, quaternion_wxyz_to_matrix

        from real_robot.errors import InvalidStateError

        msg, width, pose = self._fresh_state()
        index = {name: i for i, name in enumerate(msg.name)}
        q = np.array([msg.position[index[n]] for n in self.config.arm_joint_names], dtype=np.float64)
        p, o = pose.pose.position, pose.pose.orientation
        try:
            T = pose_matrix(np.array([p.x, p.y, p.z]), quaternion_wxyz_to_matrix(np.array([o.w, o.x, o.y, o.z])))
        except ValueError as e:
            raise InvalidStateError(f"the TCP pose on {self.config.tcp_pose_topic}: {e}") from None
        if not np.isfinite(T).all() or not np.isfinite(q).all():
            raise InvalidStateError(f"the state on {self.config.joint_states_topic} / {self.config.tcp_pose_topic} "
                                    f"is not finite (joints {q.tolist()}, TCP {T[:3, 3].tolist()})")
        return ArmObservation(joint_positions_rad=q, gripper_width_m=width, T_base_from_tcp=T, timestamp_s=now_s())

    def _fresh_state(self) -> tuple[Any, float, Any]:
        """The newest joint state, finger width (NaN without finger joints) and pose, each received
        within ``state_timeout_s``. An old one gets that long again to be replaced: on a busy PC (policy
        inference) the thread that takes messages in may simply not have run, while the stack kept
        publishing."""
        from real_robot.errors import StaleStateError

        c, timeout_s = self.config, self.config.state_timeout_s
        give_up_s = time.monotonic() + timeout_s
        while True:
            with self._lock:
                joints, fingers, pose = self._joints, self._fingers, self._pose
            now = time.monotonic()
            ages = {"joint state": (now - joints[1], c.joint_states_topic),
                    "TCP pose": (now - pose[1], c.tcp_pose_topic)}
            if c.finger_joint_names:
                ages["finger state"] = (now - fingers[1], c.finger_joint_states_topic or c.joint_states_topic)
            if all(age <= timeout_s for age, _ in ages.values()):
                return joints[0], fingers[0] if c.finger_joint_names else math.nan, pose[0]
            if now > give_up_s:
                what, (age, topic) = max(ages.items(), key=lambda kv: kv[1][0])
                raise StaleStateError(f"the newest {what} on {topic} is {age:.3f} s old (state_timeout_s={timeout_s:g}); "
                                      f"the robot's ROS stack stopped publishing")
            time.sleep(0.005)

    # ----- stopping --------------------------------------------------------------------------------------
    def _stop(self) -> None:
        """Make the measured TCP pose the controller's target (it holds there). On a stale state, or once
        ROS is shut down in this process, nothing is published: the controller keeps the last target,
        at most one capped step away."""
        if self._node is None:
            return
        from real_robot.errors import InvalidStateError, StaleStateError

        if not self._context.ok():
            # rclpy's SIGINT / SIGTERM handler shuts every context of the process down, this one too
            logger.warning("stop: ROS is already shut down in this process; the controller keeps its last target")
            return
        try:
            self._publish_target(self.observation().T_base_from_tcp)
        except (StaleStateError, InvalidStateError) as e:
            logger.warning("stop: %s; the controller keeps its last target", e)

    @requires_connection
    def recover(self) -> bool:
        """Call the error recovery action (if configured); True when it succeeded and the state streams."""
        from real_robot.errors import StaleStateError

        if self._recovery is not None:
            goal = self._recovery._action_type.Goal()
            answer = self._final_answer(self._recovery.send_goal_async(goal), "error recovery")
            if answer is None or not _succeeded(answer):
                return False
        try:
            self.observation()
        except StaleStateError:
            return False
        return True

    # ----- motion hooks (reached only through Arm's permit check) ---------------------------------------
    def _publish_target(self, T_base_from_tcp: Any) -> None:
        import numpy as np
        from geometry_msgs.msg import PoseStamped

        from real_robot.transforms import is_rigid_transform, matrix_to_quaternion_wxyz

        T = np.asarray(T_base_from_tcp, dtype=np.float64).reshape(4, 4)
        if not is_rigid_transform(T):  # the layer checks its targets; this guards every other path too
            raise MotionError(f"{self}: refusing to publish a target that is not a rigid transform: {T.tolist()}")
        msg = PoseStamped()
        msg.header.frame_id = self.config.base_frame
        msg.header.stamp = self._node.get_clock().now().to_msg()
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in T[:3, 3])
        w, x, y, z = matrix_to_quaternion_wxyz(T[:3, :3])
        msg.pose.orientation.w, msg.pose.orientation.x = float(w), float(x)
        msg.pose.orientation.y, msg.pose.orientation.z = float(y), float(z)
        self._target_pub.publish(msg)

    def _start_move_to_pose(self, T_base_from_tcp: Any) -> None:
        import numpy as np

        self._motion = None
        target = np.asarray(T_base_from_tcp, dtype=np.float64).reshape(4, 4)
        if not self.config.wait_for_motion:
            self._publish_target(target)
            return
        # where the TCP was before the target went out: read after it, a busy process may already see the
        # motion done, and a step that then "never came nearer" would wait settle_timeout_s out
        start = self.observation().T_base_from_tcp
        self._publish_target(target)
        self._motion = lambda: self._settle_at_pose(target, start)

    def _finish_motion(self) -> None:
        settle, self._motion = self._motion, None
        if settle is not None:
            settle()

    def _settle_at_pose(self, target: Any, start: Any) -> None:
        T = previous = start
        start_distance = _pose_distance(T, target)
        deadline_s = time.monotonic() + self.config.settle_timeout_s
        while time.monotonic() < deadline_s:
            time.sleep(AT_REST_INTERVAL_S)
            T = self.observation().T_base_from_tcp
            distance = _pose_distance(T, target)
            if distance < ARRIVED_M:
                return
            # at rest short of the target (contact, a controller's steady-state error), once it has come
            # nearer: a controller takes a moment to react, and a TCP that has not started is not at rest
            if distance < start_distance - MOVED_M and _pose_distance(T, previous) < AT_REST_M:
                return
            previous = T
        logger.log(logging.WARNING if not self._warned_settle else logging.DEBUG,
                   "%s: a step was %.1f mm (pose distance) short of its target after settle_timeout_s=%g s; the next "
                   "step starts from where the TCP is", self, 1000 * _pose_distance(T, target),
                   self.config.settle_timeout_s)
        self._warned_settle = True

    def _start_move_to_joint_positions(self, joint_positions_rad: Any) -> None:
        import numpy as np
        from trajectory_msgs.msg import JointTrajectory, JointTrajectoryPoint

        self._motion = None
        if self._trajectory_pub is None:
            raise MotionError(f"{self} has no joint_trajectory_topic: home the arm with the robot stack's own tools, or "
                              f"set joint_trajectory_topic to a joint trajectory controller's topic")
        target = np.asarray(joint_positions_rad, dtype=np.float64).reshape(NUM_JOINTS)
        distance = float(np.max(np.abs(target - self.observation().joint_positions_rad)))
        duration_s = max(1.0, distance / (FRANKA_MAX_JOINT_SPEED_RAD_PER_S * self.config.relative_dynamics_factor))
        msg = JointTrajectory()
        msg.joint_names = list(self.config.arm_joint_names)
        point = JointTrajectoryPoint(positions=[float(v) for v in target], velocities=[0.0] * NUM_JOINTS)
        point.time_from_start.sec = int(duration_s)
        point.time_from_start.nanosec = int((duration_s % 1) * 1e9)
        msg.points = [point]
        self._trajectory_pub.publish(msg)
        self._motion = lambda: self._settle_at_joints(target, duration_s)

    def _settle_at_joints(self, target: Any, duration_s: float) -> None:
        import numpy as np

        deadline_s = time.monotonic() + duration_s + 5.0
        previous = self.observation().joint_positions_rad
        while time.monotonic() < deadline_s:
            time.sleep(AT_REST_INTERVAL_S)
            q = self.observation().joint_positions_rad
            # there, and come to rest (a trajectory's last centimetres are slow: do not return mid-way)
            if np.max(np.abs(q - target)) < HOME_TOLERANCE_RAD and np.max(np.abs(q - previous)) < HOME_AT_REST_RAD:
                return
            previous = q
        error = np.max(np.abs(self.observation().joint_positions_rad - target))
        raise MotionError(f"{self} did not reach the joint target within {duration_s + 5:.1f} s (still {error:.3f} rad "
                          f"away); is the controller on {self.config.joint_trajectory_topic} active?")

    def _set_gripper(self, close: bool) -> None:
        c, clients = self.config, self._gripper_call
        if not clients:
            return
        ns = c.gripper_namespace.rstrip("/")
        width = 0.0 if close else 0.08
        if c.gripper == "franka_msgs":
            client = clients[f"{ns}/grasp" if close else f"{ns}/move"]
            goal = client._action_type.Goal()
            goal.width, goal.speed = width, c.gripper_speed_m_per_s
            if close:  # any final width counts as a grasp: the policy decides, not an object-size guess
                goal.force, goal.epsilon.inner, goal.epsilon.outer = c.grasp_force_n, 0.005, 1.0
            future = client.send_goal_async(goal)
        elif c.gripper == "gripper_command":
            client = clients[f"{ns}/gripper_action"]
            goal = client._action_type.Goal()
            goal.command.position, goal.command.max_effort = width / 2, c.grasp_force_n
            future = client.send_goal_async(goal)
        else:
            client = clients[f"{ns}/close"]
            future = client.call_async(client.srv_type.Request(data=bool(close)))
        self._gripper_future, self._gripper_closing = future, close
        if c.wait_for_motion:
            self._wait_gripper()

    def _gripper_busy(self) -> bool:
        future = self._gripper_future
        if future is None:
            return False
        if not future.done():
            return True
        answer = future.result()
        if getattr(answer, "accepted", False):  # an action's goal, accepted: it runs until its result comes
            self._gripper_future = future = answer.get_result_async()
            return not future.done()
        return False

    def _wait_gripper(self) -> None:
        future, self._gripper_future = self._gripper_future, None
        if future is None:
            return
        answer = self._final_answer(future, "the gripper")
        # a grasp that closes on an object may report failure (franka_gripper's GripperCommand does, when
        # the fingers stop wide of 0); an open that fails leaves the policy's "open" undone: say so
        if answer is not None and not self._gripper_closing and not _succeeded(answer):
            logger.warning("%s: the gripper did not open (%s)", self, answer)

    def _final_answer(self, future: Any, what: str) -> Any:
        """A service's response, or an action's result once its goal was accepted (the goal response
        when refused); None when either does not come within 10 s."""
        answer = self._await(future, 10.0, what)
        if answer is not None and getattr(answer, "accepted", False):
            answer = self._await(answer.get_result_async(), 10.0, what)
        return answer

    def _await(self, future: Any, timeout_s: float, what: str) -> Any:
        deadline_s = time.monotonic() + timeout_s
        while not future.done():
            if time.monotonic() > deadline_s:
                logger.warning("%s did not answer within %.0f s", what, timeout_s)
                return None
            time.sleep(0.005)
        return future.result()
