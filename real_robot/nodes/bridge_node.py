"""ROS 2 bridge node: the Franka arm behind its always-on ``SafetyLayer``.

    python -m real_robot.nodes.bridge_node --ros-args -r __node:=franka_bridge -p robot_ip:='172.16.0.2' \\
        -p safety_limits_file:='cell_limits.yaml' -p dry_run:=true

The arm is franky at ``robot_ip``, or (``ros_arm_file``, a ``RosArmConfig`` YAML) the robot PC's ROS 2
stack through ``RosArm``: exactly one of the two.

Publishes (``real_robot.nodes.common`` lists the types):

- ``joint_states`` and ``tcp_pose``: the raw arm state at ``state_rate_hz``; both messages of one
  reading carry the same header stamp.
- ``action_sent``: after each executed action, what the safety layer really sent (``SentCommand.action``).
- ``ready`` (latched): the bridge is idle, the last chunk is done (its last action executed and its
  control period over), or a chunk was dropped, or the arm was homed. Also once at start.

Subscribes ``action_chunk`` ([C, 7] twin actions): the actions run one per ``control_period_s``
through ``SafetyLayer.send_action``, in a thread of their own; a new chunk replaces what is left of
the previous one. A chunk with NaN or infinity goes to the safety layer at once, which stops the arm;
the node logs it and drops the chunk (and what was left of the previous one). A malformed chunk stops
the arm as well.

Services (``std_srvs/Trigger``): ``~/home`` (drop the queue and stop, recover from a reflex, move to
the home joints and open the gripper, as a twin episode starts; chunks that arrive meanwhile are dropped), ``~/stop`` (drop the queue, stop the arm,
drop every chunk until ``~/resume``; answered at once, also while homing, which it cuts short),
``~/resume``. An action taken from the queue before a ``~/stop`` is not sent after it.

On SIGINT / SIGTERM the node stops the arm, closes the safety layer and disconnects; during the homing
of ``home_on_start`` it stops the arm at once.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import sys
import threading
import time
from typing import Any

from real_robot.errors import MotionError, UnsafeActionError, require_module

DEFAULT_CONTROL_PERIOD_S = 0.2
"""One action per 0.2 s: the twin's control rate (5 Hz)."""
EXECUTOR_THREADS = 4
"""State, chunks, ~/stop, and ~/home with ~/resume: each its own callback group, all at once."""

PARAMETERS = {
    "robot_ip": ("str", "", "the robot's FCI address, e.g. 172.16.0.2 (franky-sim: its 127.x address): franky"),
    "ros_arm_file": ("str", "", "instead of robot_ip, a RosArmConfig YAML: the arm through the robot PC's ROS 2 stack"),
    "ignore_realtime": ("bool", False, "connect without a realtime kernel: franky-sim only, never the robot"),
    "relative_dynamics_factor": ("float", 0.1, "fraction of the arm's max velocity, acceleration and jerk"),
    "connect_timeout_s": ("float", 3.0, "give up connecting after this long"),
    "safety_limits_file": ("str", "", "SafetyLimits as YAML or JSON; empty: the conservative defaults"),
    "dry_run": ("bool", False, "log every command, move nothing (also when the limits file says so)"),
    "home_joint_positions_rad": ("float_list", None, "where ~/home goes (7 joints); unset: the limits' home"),
    "home_on_start": ("bool", False, "move home once connected"),
    "control_period_s": ("float", DEFAULT_CONTROL_PERIOD_S, "seconds per action of a chunk"),
    "state_rate_hz": ("float", 20.0, "rate of joint_states and tcp_pose"),
    "base_frame": ("str", "base", "header.frame_id of tcp_pose and joint_states"),
}


class Bridge:
    """The bridge's ROS side around a ``SafetyLayer``: state out, chunks in, an execution thread."""

    def __init__(self, node: Any, safety: Any, *, control_period_s: float, state_rate_hz: float,
                 base_frame: str):
        from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
        from sensor_msgs.msg import JointState
        from geometry_msgs.msg import PoseStamped
        from std_msgs.msg import Float32MultiArray, Header
        from std_srvs.srv import Trigger

        from real_robot.nodes import common

        if not 0.0 < control_period_s <= 10.0:
            raise ValueError(f"control_period_s={control_period_s}: seconds in (0, 10]")
        if control_period_s >= safety.limits.watchdog_timeout_s:  # it would stop the arm between every two actions
            raise ValueError(f"control_period_s={control_period_s} must be below the safety limits' "
                             f"watchdog_timeout_s={safety.limits.watchdog_timeout_s}")
        if not 1.0 <= state_rate_hz <= 1000.0:
            raise ValueError(f"state_rate_hz={state_rate_hz}: in [1, 1000] (the twin needs >= 10)")
        self.node, self.safety = node, safety
        self.control_period_s, self.base_frame = control_period_s, base_frame
        self.log = node.get_logger()
        self._cond = threading.Condition()
        self._queue: collections.deque = collections.deque()
        self._need_ready = True  # the bridge starts idle
        self._held = False
        self._homing = False
        self._running = True
        self.chunks_received = 0

        self.joint_pub = node.create_publisher(JointState, common.JOINT_STATES_TOPIC, 10)
        self.pose_pub = node.create_publisher(PoseStamped, common.TCP_POSE_TOPIC, 10)
        self.sent_pub = node.create_publisher(Float32MultiArray, common.ACTION_SENT_TOPIC, 10)
        self.ready_pub = node.create_publisher(Header, common.READY_TOPIC, common.ready_qos())
        # state, chunks, ~/stop and the other services in separate groups: homing (seconds) blocks
        # neither the state, a NaN chunk's stop nor ~/stop, which cuts it (a MultiThreadedExecutor of
        # EXECUTOR_THREADS)
        node.create_subscription(Float32MultiArray, common.ACTION_CHUNK_TOPIC, self._on_chunk, 10,
                                 callback_group=MutuallyExclusiveCallbackGroup())
        node.create_timer(1.0 / state_rate_hz, self._publish_state, callback_group=MutuallyExclusiveCallbackGroup())
        services = MutuallyExclusiveCallbackGroup()
        node.create_service(Trigger, "~/home", self._on_home, callback_group=services)
        node.create_service(Trigger, "~/stop", self._on_stop, callback_group=MutuallyExclusiveCallbackGroup())
        node.create_service(Trigger, "~/resume", self._on_resume, callback_group=services)
        self._executor_thread = threading.Thread(target=self._execute, name="bridge-actions", daemon=True)
        self._executor_thread.start()

    # ----- state --------------------------------------------------------------------------------
    def _publish_state(self) -> None:
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import JointState

        from real_robot.nodes.common import JOINT_STATE_NAMES, pose_from_matrix, safe_publish

        # stamped before the read: a state stamped after a ready was read after it (the policy acts
        # only on those), which a stamp taken after a slow read would not guarantee
        stamp = self.node.get_clock().now().to_msg()
        try:
            obs = self.safety.observation()
        except Exception as e:  # noqa: BLE001  a failed read is reported, the next tick tries again
            self.log.error(f"reading the arm failed: {e!r}", throttle_duration_sec=5.0)
            return
        joints = JointState()
        joints.header.stamp, joints.header.frame_id = stamp, self.base_frame
        joints.name = list(JOINT_STATE_NAMES)
        joints.position = [float(v) for v in obs.joint_positions_rad] + [float(obs.gripper_width_m)]
        pose = PoseStamped()
        pose.header.stamp, pose.header.frame_id = stamp, self.base_frame
        pose.pose = pose_from_matrix(obs.T_base_from_tcp)
        safe_publish(self.node, self.joint_pub, joints)
        safe_publish(self.node, self.pose_pub, pose)

    # ----- chunks -------------------------------------------------------------------------------
    def _on_chunk(self, msg: Any) -> None:
        import numpy as np

        from real_robot.nodes.common import chunk_from_msg

        self.chunks_received += 1
        try:
            chunk = chunk_from_msg(msg)
        except ValueError as e:
            self._drop(f"a malformed action chunk ({e})")
            self._stop_arm()
            return
        bad_rows = np.flatnonzero(~np.isfinite(chunk).all(axis=1))
        if bad_rows.size:
            self._drop(f"an action chunk with non-finite values in rows {bad_rows.tolist()}")
            try:
                self.safety.send_action(chunk[bad_rows[0]])  # the layer stops the arm and counts it
            except UnsafeActionError as e:
                self.log.error(f"safety layer: {e}")
            except Exception as e:  # noqa: BLE001  the layer did not get to stop the arm: stop it here
                self.log.error(f"safety layer: {e!r}")
                self._stop_arm()
            return
        with self._cond:
            if self._held:
                self.log.warning("stopped (~/stop): dropping action chunks until ~/resume",
                                 throttle_duration_sec=5.0)
                return
            if self._homing:  # computed from an arm on its way home: it would run from the home pose
                self.log.warning("homing (~/home): dropping action chunks until it is done", throttle_duration_sec=5.0)
                return
            replaced = len(self._queue)
            self._queue = collections.deque(chunk)
            self._cond.notify_all()
        if replaced:
            self.log.debug(f"a new chunk of {len(chunk)} replaced {replaced} actions left of the previous one")

    def _drop(self, what: str) -> None:
        with self._cond:
            left = len(self._queue)
            self._queue.clear()
            self._need_ready = True
            self._cond.notify_all()
        self.log.error(f"dropped {what}; the arm was stopped"
                       + (f", and the {left} actions left of the previous chunk" if left else ""))

    def _stop_arm(self) -> None:
        try:
            self.safety.stop()
        except Exception as e:  # noqa: BLE001  keep serving (and report): the next stop may work
            self.log.error(f"stopping the arm failed: {e!r}")

    def _execute(self) -> None:
        """The one thread that sends actions: one per control period, in order."""
        from real_robot.nodes.common import ACTION_DIM, array_msg, safe_publish

        while True:
            with self._cond:
                # while homing nothing is sent and no ready goes out: the arm is on its way, and a
                # chunk planned from there would run from home (~/home announces ready when done)
                while self._running and (self._homing or (not self._queue and not self._need_ready)):
                    self._cond.wait()
                if not self._running:
                    return
                if not self._queue:
                    self._need_ready = False
                    self._publish_ready()
                    continue
                # with the stop count of the moment it leaves the queue: ~/stop (which clears the queue
                # and stops under this lock) after this line preempts it, also before it is sent
                action, stops = self._queue.popleft(), self.safety.stop_count
            start_s = time.monotonic()
            try:
                sent = self.safety.send_action(action, stops_since=stops)
            except Exception as e:  # noqa: BLE001  report, drop the rest, keep serving
                if not self._running:
                    return  # the stop at shutdown preempted this step
                if isinstance(e, UnsafeActionError):  # cannot happen for checked chunks
                    self._drop(f"an action the safety layer refused ({e})")
                elif isinstance(e, MotionError):
                    self._drop(f"the rest of the chunk: the arm aborted a motion ({e}); ~/home recovers")
                else:  # e.g. the connection is gone
                    self._drop(f"the rest of the chunk: sending an action failed ({e!r})")
                self._stop_arm()
                continue
            safe_publish(self.node, self.sent_pub, array_msg(sent.action.reshape(ACTION_DIM), ("action",)))
            with self._cond:
                if not self._queue:
                    self._need_ready = True
                # the rest of the control period (a step that took longer leaves none)
                deadline_s = start_s + self.control_period_s
                while self._running and time.monotonic() < deadline_s:
                    self._cond.wait(deadline_s - time.monotonic())

    def _publish_ready(self) -> None:
        from std_msgs.msg import Header

        from real_robot.nodes.common import safe_publish

        msg = Header()
        msg.stamp, msg.frame_id = self.node.get_clock().now().to_msg(), self.base_frame
        safe_publish(self.node, self.ready_pub, msg)

    # ----- services -----------------------------------------------------------------------------
    def _on_home(self, request: Any, response: Any) -> Any:
        with self._cond:  # what is queued or being sent was planned from where the arm was: not after homing
            self._queue.clear()
            self._homing = True
            self._stop_arm()
        try:
            if not self.safety.limits.dry_run:
                self.safety.recover()  # after a reflex the arm takes no motion until recovered
            self.safety.home()
            self.safety.open_gripper()  # as every twin episode starts: at rest, the gripper open
            response.success, response.message = True, f"at {self.safety.limits.home_joint_positions_rad}" + (
                " (dry run: not moved)" if self.safety.limits.dry_run else "")
        except Exception as e:  # noqa: BLE001  reported to the caller
            response.success, response.message = False, f"homing failed: {e}"
            self._stop_arm()
        with self._cond:
            self._homing = False
            self._queue.clear()
            self._need_ready = True
            self._cond.notify_all()
        self.log.info(f"~/home: {response.message}")
        return response

    def _on_stop(self, request: Any, response: Any) -> Any:
        with self._cond:  # stopped under the lock: an action taken from the queue before is preempted
            self._held = True
            self._queue.clear()
            self._stop_arm()
        response.success, response.message = True, "stopped; action chunks are dropped until ~/resume"
        self.log.warning(f"~/stop: {response.message}")
        return response

    def _on_resume(self, request: Any, response: Any) -> Any:
        with self._cond:
            self._held = False
            self._need_ready = True
            self._cond.notify_all()
        response.success, response.message = True, "accepting action chunks"
        self.log.info(f"~/resume: {response.message}")
        return response

    def close(self) -> None:
        """End the execution thread (after its current action) and stop the arm."""
        with self._cond:
            self._running = False
            self._queue.clear()
            self._cond.notify_all()
        self._stop_arm()
        self._executor_thread.join(10.0)


def _state_topic_clash(node: Any, arm: Any) -> str:
    """Why the bridge's state topics would mix with the ROS 2 stack its ``RosArm`` reads ("" if not)."""
    from real_robot.nodes.common import JOINT_STATES_TOPIC, TCP_POSE_TOPIC
    from real_robot.ros_arm import RosArm

    if not isinstance(arm, RosArm):
        return ""
    for ours, theirs in ((JOINT_STATES_TOPIC, arm.config.joint_states_topic), (TCP_POSE_TOPIC, arm.config.tcp_pose_topic)):
        resolved = node.resolve_topic_name(ours)
        if resolved == node.resolve_topic_name(theirs, only_expand=True):
            return (f"the bridge would publish its {ours} on {resolved}, which its RosArm reads from the robot's stack; "
                    f"remap it (-r {ours}:=franka_bridge/{ours}, as the franka-eval graph does) or run the bridge in a "
                    f"namespace")
    return ""


def _home_unless_interrupted(safety: Any, context: Any) -> bool:
    """Home (seconds of a blocking move) in a thread while this one watches for SIGINT / SIGTERM, which
    shut ROS down: then the arm is stopped at once (cutting the move) rather than once home. Returns
    False when interrupted; raises what homing raised."""
    failed: list[BaseException] = []

    def home() -> None:
        try:
            safety.home()
            safety.open_gripper()
        except BaseException as e:  # noqa: BLE001  handed to the caller
            failed.append(e)

    homing = threading.Thread(target=home, name="bridge-home", daemon=True)
    homing.start()
    while homing.is_alive():
        homing.join(0.05)
        if not context.ok():
            safety.stop()
            homing.join(10.0)
            return False
    if failed:
        raise failed[0]
    return True


def main(argv: list[str] | None = None) -> int:
    rclpy = require_module("rclpy", extra="ros")
    from rclpy.executors import MultiThreadedExecutor

    from real_robot.factory import make_arm
    from real_robot.nodes.common import ParameterError, configure_logging, declare_parameters, spin
    from real_robot.safety import SafetyLayer, SafetyLimits

    configure_logging()
    rclpy.init(args=sys.argv if argv is None else argv)
    node = rclpy.create_node("franka_bridge")
    log = node.get_logger()
    arm = safety = bridge = None
    try:
        try:
            p = declare_parameters(node, PARAMETERS)
            limits = SafetyLimits.from_file(p["safety_limits_file"]) if p["safety_limits_file"] else SafetyLimits()
            changes: dict[str, Any] = {"dry_run": limits.dry_run or p["dry_run"]}
            if p["home_joint_positions_rad"] is not None:
                changes["home_joint_positions_rad"] = p["home_joint_positions_rad"]
            limits = dataclasses.replace(limits, **changes)
            arm = make_arm(robot_ip=p["robot_ip"], ros_arm=p["ros_arm_file"], ignore_realtime=p["ignore_realtime"],
                           relative_dynamics_factor=p["relative_dynamics_factor"],
                           connect_timeout_s=p["connect_timeout_s"])
        except (ParameterError, ValueError, FileNotFoundError) as e:
            log.fatal(str(e))
            return 2
        clash = _state_topic_clash(node, arm)
        if clash:
            log.fatal(clash)
            return 2
        try:
            arm.connect()
            safety = SafetyLayer(arm, limits)
            if p["home_on_start"] and not _home_unless_interrupted(safety, node.context):
                logging.getLogger("franka_bridge").warning("SIGINT / SIGTERM while homing at start: stopped the arm")
                return 0
            bridge = Bridge(node, safety, control_period_s=p["control_period_s"], state_rate_hz=p["state_rate_hz"],
                            base_frame=p["base_frame"])
        except Exception as e:  # noqa: BLE001  unreachable robot, bad setup: say so and exit
            log.fatal(f"{arm}: {e}")
            return 1
        log.info(f"bridging {arm}{' (dry run: nothing moves)' if limits.dry_run else ''}; one action per "
                 f"{p['control_period_s']} s")
        spin(node, MultiThreadedExecutor(num_threads=EXECUTOR_THREADS))
        return 0
    finally:
        if bridge is not None:
            bridge.close()
        if safety is not None:
            safety.close()  # stops the arm
        if arm is not None and arm.is_connected:
            arm.disconnect()
            # Python logging: the ROS context is already shut down (SIGINT / SIGTERM)
            logging.getLogger("franka_bridge").info(f"stopped {arm} and disconnected")
        node.destroy_node()
        rclpy.try_shutdown()


if __name__ == "__main__":
    sys.exit(main())
