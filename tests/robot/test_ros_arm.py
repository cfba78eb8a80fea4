"""``RosArm`` over real rclpy against a franka_ros2-style stack on franky-sim (``ros_franka_stack.py``):
state in, homing, stop, each gripper interface, error recovery, a frozen stack, a missing stack,
message types that are not installed, and the config. Its parity with the twin is in
``test_franka_parity.py``."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import signal
import threading
import time
from typing import Callable

import numpy as np
import pytest

pytestmark = pytest.mark.slow
rclpy = pytest.importorskip("rclpy", reason="the ros extra: bash scripts/setup.sh dev,robot,ros")

from real_robot.errors import (InvalidStateError, MotionError, RealRobotError, RobotUnreachableError,  # noqa: E402
                               SafetyBypassError, StaleStateError)
from real_robot.ros_arm import RosArm, RosArmConfig  # noqa: E402
from real_robot.safety import SafetyLayer, SafetyLimits  # noqa: E402
from ros_franka_stack import DOMAIN_ID, ros_arm_config, start_stack  # noqa: E402

LIMITS = SafetyLimits(max_relative_dynamics_factor=0.5, min_step_interval_s=0.0, watchdog_timeout_s=30.0)


@pytest.fixture(scope="module")
def stack(franky_sim, tmp_path_factory):
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the realtime priority franky left here
    with start_stack(franky_sim, tmp_path_factory.mktemp("ros-stack") / "stack.log") as proc:
        yield proc


def test_state_comes_in_homing_goes_out_and_motion_needs_the_safety_layer(stack, home_tcp_position_m):
    with RosArm(ros_arm_config()) as arm:
        obs = arm.observation()
        assert obs.joint_positions_rad.shape == (7,) and np.all(np.isfinite(obs.joint_positions_rad))
        assert 0.0 <= obs.gripper_width_m <= 0.081  # the two finger joints, summed
        np.testing.assert_allclose(obs.T_base_from_tcp[:3, :3] @ obs.T_base_from_tcp[:3, :3].T, np.eye(3), atol=1e-6)
        with pytest.raises(SafetyBypassError):
            arm.move_to_pose(obs.T_base_from_tcp)
        layer = SafetyLayer(arm, LIMITS)
        try:
            layer.home()  # a JointTrajectory to the stack's joint trajectory controller
            np.testing.assert_allclose(arm.observation().joint_positions_rad, LIMITS.home_joint_positions_rad, atol=0.01)
            np.testing.assert_allclose(arm.observation().tcp_position_m, home_tcp_position_m, atol=0.003)
        finally:
            layer.close()
    with RosArm(ros_arm_config(joint_trajectory_topic="")) as arm, SafetyLayer(arm, LIMITS) as layer:
        with pytest.raises(MotionError, match="joint_trajectory_topic"):
            layer.home()


def test_arm_and_fingers_from_separate_topics_read_the_same(stack):
    """franka_ros2 without the joined /joint_states: the arm's and the gripper's own JointState topics."""
    with RosArm(ros_arm_config()) as joined, RosArm(ros_arm_config(
            joint_states_topic="/franka/joint_states", finger_joint_states_topic="/fr3_gripper/joint_states")) as split:
        a, b = joined.observation(), split.observation()
        np.testing.assert_allclose(a.joint_positions_rad, b.joint_positions_rad, atol=1e-3)
        assert a.gripper_width_m == pytest.approx(b.gripper_width_m, abs=1e-3) and 0 < b.gripper_width_m <= 0.081
    with pytest.raises(RobotUnreachableError, match="the fingers panda_finger_joint1, panda_finger_joint2 on "
                                                    "/joint_states"):
        RosArm(ros_arm_config(finger_joint_names=("panda_finger_joint1", "panda_finger_joint2"),
                              connect_timeout_s=1.0)).connect()


def test_stop_makes_the_measured_pose_the_target(stack):
    """A 2 cm step, not waited for, then ``stop``: the arm stays near where it was, short of the step."""
    with RosArm(ros_arm_config(wait_for_motion=False)) as arm, SafetyLayer(arm, LIMITS) as layer:
        layer.home()
        start = arm.observation().tcp_position_m
        sent = layer.send_action(np.array([0.2, 0, 0, 0, 0, 0, -1.0]))  # 2 cm along x
        assert sent.translation_m[0] == pytest.approx(0.02)
        arm.stop()
        time.sleep(1.5)
        end = arm.observation().tcp_position_m
        assert np.linalg.norm(end - start) < 0.005, (start, end)
        # without the stop it goes the whole way
        layer.send_action(np.array([0.2, 0, 0, 0, 0, 0, -1.0]))
        time.sleep(1.5)
        assert arm.observation().tcp_position_m[0] - end[0] == pytest.approx(0.02, abs=0.003)


@pytest.mark.parametrize("gripper", ["franka_msgs", "gripper_command", "set_bool"])
def test_each_gripper_interface_opens_and_closes_the_fingers(stack, gripper):
    """franka_ros2's gripper actions (franka_msgs ``grasp`` / ``move``), a control_msgs ``GripperCommand``
    server (one finger's position: half the width; a width past the hand's maximum is aborted) and a
    ``SetBool`` service: the fingers measured after each command, closing on nothing and opening."""
    limits = dataclasses.replace(LIMITS, gripper_min_interval_s=0.0)
    with RosArm(ros_arm_config(gripper=gripper)) as arm, SafetyLayer(arm, limits) as layer:
        layer.home()
        widths = []
        for g in (-1.0, 1.0, -1.0):  # open, close, open
            sent = layer.send_action(np.array([0, 0, 0, 0, 0, 0, g]))
            assert sent.gripper_changed
            widths.append(arm.observation().gripper_width_m)
    assert widths[0] > 0.07 and widths[1] < 0.01 and widths[2] > 0.07, widths


def test_a_gripper_goal_while_the_fingers_move_is_kept_and_sent_once_the_running_one_ends(stack):
    """Asynchronous steps on franka_ros2's gripper actions: an open sent while the grasp still runs
    returns at once and goes out (its goal) once the grasp's result has come."""
    limits = dataclasses.replace(LIMITS, gripper_min_interval_s=0.0)
    with RosArm(ros_arm_config(wait_for_motion=False)) as arm, SafetyLayer(arm, limits) as layer:
        layer.home()
        layer.open_gripper()
        deadline = time.monotonic() + 5.0
        while (arm.observation().gripper_width_m < 0.0795 or arm._gripper_busy()) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert layer.send_action(np.array([0, 0, 0, 0, 0, 0, 1.0])).gripper_changed  # close: sent
        assert layer.send_action(np.array([0, 0, 0, 0, 0, 0, -1.0])).gripper_changed  # open: kept
        returned = arm.observation().gripper_width_m
        time.sleep(0.3)
        assert arm.observation().gripper_width_m < returned - 0.002, "the open waited for the grasp to end"
        deadline = time.monotonic() + 6.0
        while arm.observation().gripper_width_m < 0.075 and time.monotonic() < deadline:
            layer.send_action(np.array([0, 0, 0, 0, 0, 0, -1.0]))
            time.sleep(0.1)
        assert arm.observation().gripper_width_m > 0.075, "the kept open was never sent"


def test_recover_calls_the_stacks_error_recovery_and_failures_are_reported(stack, caplog):
    """``recover()`` sends franka_ros2's ``ErrorRecovery`` goal: the stack's (franky's error recovery)
    succeeds. Servers that abort every goal (the test's own, beside the stack): ``recover()`` returns
    False, and a gripper open that fails is warned about (a close may fail on an object; not warned)."""
    from control_msgs.action import GripperCommand
    from franka_msgs.action import ErrorRecovery
    from rclpy.action import ActionServer

    with RosArm(ros_arm_config()) as arm:
        assert arm.recover()
    context = rclpy.Context()
    rclpy.init(args=[], context=context, domain_id=DOMAIN_ID,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("failing_servers", context=context)
    goals = []

    def aborting(action_type):
        def execute(goal_handle):
            goals.append(type(goal_handle.request).__name__)
            goal_handle.abort()
            return action_type.Result()
        return execute

    ActionServer(node, ErrorRecovery, "/vla_test/failing_recovery", aborting(ErrorRecovery))
    ActionServer(node, GripperCommand, "/vla_test/gripper_action", aborting(GripperCommand))
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    threading.Thread(target=executor.spin, daemon=True).start()
    limits = dataclasses.replace(LIMITS, gripper_min_interval_s=0.0)
    try:
        with RosArm(ros_arm_config(error_recovery_action="/vla_test/failing_recovery", gripper="gripper_command",
                                   gripper_namespace="/vla_test")) as arm, SafetyLayer(arm, limits) as layer:
            assert not arm.recover()
            layer.send_action(np.array([0, 0, 0, 0, 0, 0, 1.0]))  # close: its failure is not warned about
            assert not any("did not open" in r.getMessage() for r in caplog.records)
            layer.send_action(np.array([0, 0, 0, 0, 0, 0, -1.0]))
            assert any("the gripper did not open" in r.getMessage() for r in caplog.records)
    finally:
        executor.shutdown(timeout_sec=1.0)
        context.try_shutdown()
    assert goals == ["ErrorRecovery_Goal", "GripperCommand_Goal", "GripperCommand_Goal"], goals


def test_a_frozen_stack_stale_state_nothing_is_sent(stack):
    """The stack stops publishing (SIGSTOP): reading the state and stepping are refused, and nothing
    reaches the controller (a target queued meanwhile would move the arm once the stack runs again)."""
    with RosArm(ros_arm_config(state_timeout_s=0.3)) as arm, SafetyLayer(arm, LIMITS) as layer:
        before = arm.observation().tcp_position_m
        stack.send_signal(signal.SIGSTOP)
        try:
            time.sleep(0.6)
            with pytest.raises(StaleStateError, match="the robot's ROS stack stopped publishing"):
                arm.observation()  # names the joints' or the pose's topic: whichever went quiet first
            with pytest.raises(StaleStateError):
                layer.send_action(np.array([0.5, 0, 0, 0, 0, 0, -1.0]))
            arm.stop()  # nothing to hold on: logs, sends nothing
        finally:
            stack.send_signal(signal.SIGCONT)
        time.sleep(1.5)
        np.testing.assert_allclose(arm.observation().tcp_position_m, before, atol=0.001)


@contextlib.contextmanager
def scripted_stack(domain: int, pose_at: Callable[[list[float]], tuple], targets: list | None = None):
    """A stack that is a script: at 100 Hz it publishes joint states and the TCP pose
    ``pose_at(target_arrival_times)`` gives (``(position xyz, quaternion wxyz)``); each target that
    arrives is appended to ``targets`` as ``(time.monotonic(), position, quaternion wxyz)``."""
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import JointState

    context = rclpy.Context()
    rclpy.init(args=[], context=context, domain_id=domain,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("scripted_stack", context=context)
    joints = node.create_publisher(JointState, "/joint_states", 10)
    pose = node.create_publisher(PoseStamped, "/franka_robot_state_broadcaster/current_pose", 10)
    targets = [] if targets is None else targets
    arrived_s: list[float] = []

    def target(msg) -> None:
        p, o = msg.pose.position, msg.pose.orientation
        arrived_s.append(time.monotonic())
        targets.append((arrived_s[-1], (p.x, p.y, p.z), (o.w, o.x, o.y, o.z)))

    node.create_subscription(PoseStamped, "/cartesian_impedance_controller/target_pose", target, 10)

    def publish() -> None:
        position, (w, x, y, z) = pose_at(arrived_s)
        msg = PoseStamped()
        msg.header.stamp, msg.header.frame_id = node.get_clock().now().to_msg(), "base"
        msg.pose.position.x, msg.pose.position.y, msg.pose.position.z = (float(v) for v in position)
        o = msg.pose.orientation
        o.w, o.x, o.y, o.z = float(w), float(x), float(y), float(z)
        joints.publish(JointState(name=[f"fr3_joint{i}" for i in range(1, 8)] + ["fr3_finger_joint1",
                                  "fr3_finger_joint2"], position=[0.0] * 7 + [0.04, 0.04]))
        pose.publish(msg)

    node.create_timer(0.01, publish)
    executor = rclpy.executors.SingleThreadedExecutor(context=context)
    executor.add_node(node)
    spinner = threading.Thread(target=executor.spin, daemon=True)
    spinner.start()
    try:
        yield targets
    finally:
        executor.shutdown(timeout_sec=1.0)
        context.try_shutdown()


POINTING_DOWN = (0.0, 1.0, 0.0, 0.0)  # wxyz


@pytest.mark.parametrize("drift_m, waits, busy", [((0.0, 0.003, 0.0), True, False), ((0.0, 0.0, 0.005), False, False),
                                                   ((0.0, 0.0, 0.005), False, True)])
def test_a_step_ends_at_rest_only_once_the_tcp_came_nearer_its_target(drift_m, waits, busy, caplog):
    """A scripted stack whose TCP, once a target arrives, drifts ``drift_m`` in 0.1 s and stops. Sideways
    (the last millimetres of the previous step while the controller has not taken up the new target)
    the step has not begun: it waits out ``settle_timeout_s`` and warns; returning at rest there let
    the next step replace this one before it started, and it was lost. Toward the target and stuck
    (contact) it has: it ends at rest, without waiting the timeout out; also when the process is
    ``busy`` (descheduled for 0.25 s right after the target went out, so the motion is over before it
    looks again). Ending at rest is told from waiting the timeout out by the warning the latter logs,
    with a timeout long enough (3 s) that a loaded machine does not reach it where the step ends at rest."""
    def pose_at(arrived_s):
        moved = min(1.0, (time.monotonic() - arrived_s[0]) / 0.1) if arrived_s else 0.0
        return [v + moved * d for v, d in zip((0.5, 0.0, 0.3), drift_m)], POINTING_DOWN

    domain = (DOMAIN_ID + 2) % 233  # apart from the stack's and the missing stack's
    settle_timeout_s = 0.8 if waits else 3.0
    config = ros_arm_config(domain_id=domain, gripper="none", error_recovery_action="",
                            settle_timeout_s=settle_timeout_s)
    with scripted_stack(domain, pose_at), RosArm(config) as arm, SafetyLayer(arm, LIMITS) as layer:
        if busy:
            publish_target = arm._publish_target
            arm._publish_target = lambda T: (publish_target(T), time.sleep(0.25))
        started = time.monotonic()
        layer.send_action(np.array([0, 0, 0.5, 0, 0, 0, -1.0]))  # 5 cm up
        took_s = time.monotonic() - started
    warned = any("short of its target" in r.getMessage() for r in caplog.records)
    if waits:
        assert took_s >= settle_timeout_s and warned, (took_s, warned)
    else:
        assert took_s < settle_timeout_s and not warned, (took_s, warned)


def test_a_pose_that_is_no_rotation_is_never_made_a_target():
    """A stack whose TCP pose carries an all-zero quaternion (a default-constructed message): the
    arm's reading names it, the layer refuses to step from it, and neither the step, the layer's
    stop nor the arm's own stop publish a target built on it (it would hold NaN)."""
    domain = (DOMAIN_ID + 3) % 233
    config = ros_arm_config(domain_id=domain, gripper="none", error_recovery_action="")
    with scripted_stack(domain, lambda _: ((0.5, 0.0, 0.3), (0.0, 0.0, 0.0, 0.0))) as targets:
        with RosArm(config) as arm, SafetyLayer(arm, LIMITS) as layer:
            with pytest.raises(InvalidStateError, match="current_pose: quaternion .* is not a rotation"):
                arm.observation()
            with pytest.raises(InvalidStateError):
                layer.send_action(np.array([0.1, 0, 0, 0, 0, 0, -1.0]))
            arm.stop()
        time.sleep(0.3)
    assert targets == []


def test_a_dry_run_publishes_no_target_stops_and_disconnect_included():
    """Dry run: nothing reaches the controller. The layer's stops are logged only, and the arm's own
    stop (which a disconnect makes, after the layer closed) publishes nothing either."""
    domain = (DOMAIN_ID + 4) % 233
    config = ros_arm_config(domain_id=domain, gripper="none", error_recovery_action="")
    with scripted_stack(domain, lambda _: ((0.5, 0.0, 0.3), POINTING_DOWN)) as targets:
        with RosArm(config) as arm, SafetyLayer(arm, dataclasses.replace(LIMITS, dry_run=True)) as layer:
            assert layer.send_action(np.array([0.1, 0, 0, 0, 0, 0, -1.0])).dry_run
            layer.stop()
            arm.stop()
        time.sleep(0.3)
        assert targets == []
        with RosArm(config) as arm, SafetyLayer(arm, LIMITS) as layer:  # a moving layer: the arm stops again
            arm.stop()
            deadline_s = time.monotonic() + 5.0
            while not targets and time.monotonic() < deadline_s:
                time.sleep(0.05)
        assert targets and np.allclose(targets[0][1], (0.5, 0.0, 0.3))


def test_a_stop_while_a_step_reads_the_arm_sends_only_the_hold():
    """A waited-for step reads the TCP before it publishes its target (0.25 s on a stale stream): a stop
    coming then (here: at the arm's permit check, after the layer looked for one) publishes the
    measured pose to hold, and the step's target never follows it."""
    domain = (DOMAIN_ID + 5) % 233
    config = ros_arm_config(domain_id=domain, gripper="none", error_recovery_action="", settle_timeout_s=0.5)
    with scripted_stack(domain, lambda _: ((0.5, 0.0, 0.3), POINTING_DOWN)) as targets:
        with RosArm(config) as arm, SafetyLayer(arm, LIMITS) as layer:
            check = arm._check_permit

            def stop_then_check(permit, command):
                del arm._check_permit
                layer.stop()
                check(permit, command)

            arm._check_permit = stop_then_check
            assert layer.send_action(np.array([0, 0, 0.5, 0, 0, 0, -1.0])).preempted
            time.sleep(0.3)
            assert [t[1] for t in targets] == [pytest.approx((0.5, 0.0, 0.3))], "the step's target followed the stop"


def test_no_stack_is_named_with_its_topics():
    config = ros_arm_config(domain_id=(DOMAIN_ID + 1) % 233, connect_timeout_s=1.0)
    started = time.monotonic()
    with pytest.raises(RobotUnreachableError) as e:
        RosArm(config).connect()
    assert time.monotonic() - started < 10
    assert "the arm joints on /joint_states (0 publishers seen)" in str(e.value)
    assert "/franka_robot_state_broadcaster/current_pose" in str(e.value) and "ROS_DOMAIN_ID" in str(e.value)


@pytest.mark.parametrize("overrides, missing", [
    ({"gripper": "franka_msgs", "error_recovery_action": ""}, "franka_msgs.action.Grasp"),
    ({"gripper": "gripper_command", "error_recovery_action": ""}, "control_msgs.action.GripperCommand"),
    ({"gripper": "none"}, "franka_msgs.action.ErrorRecovery"),
])
def test_message_types_not_installed_are_named_before_any_wait(overrides, missing, monkeypatch):
    """As on a robot PC whose ROS workspace is not sourced: the tests' builds of the packages hidden."""
    for module in ("franka_msgs", "franka_msgs.action", "control_msgs", "control_msgs.action"):
        monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError
    arm = RosArm(ros_arm_config(connect_timeout_s=30.0, **overrides))
    started = time.monotonic()
    with pytest.raises(RealRobotError, match=missing.replace(".", r"\.")) as e:
        arm.connect()
    assert time.monotonic() - started < 10 and "source the robot PC's ROS workspace" in str(e.value)
    assert not arm.is_connected


def test_config_from_file_and_its_refusals(tmp_path):
    path = tmp_path / "arm.yaml"
    path.write_text("namespace: fr3\ngripper: none\narm_joint_names: [j1, j2, j3, j4, j5, j6, j7]\n")
    config = RosArmConfig.from_file(path)
    assert config.namespace == "fr3" and config.arm_joint_names == ("j1", "j2", "j3", "j4", "j5", "j6", "j7")
    path.write_text("target_pose_topc: /x\n")
    with pytest.raises(ValueError, match="target_pose_topc"):
        RosArmConfig.from_file(path)
    with pytest.raises(ValueError, match="allowed: franka_msgs, gripper_command, set_bool, none"):
        RosArmConfig(gripper="robotiq")
    with pytest.raises(ValueError, match="7 joints"):
        RosArmConfig(arm_joint_names=("a", "b"))
    with pytest.raises(ValueError, match="state_timeout_s"):
        RosArmConfig(state_timeout_s=0)


@pytest.mark.parametrize("content, message", [
    (None, "is a folder, not a file; it must be a YAML/JSON mapping of RosArmConfig fields"),
    (b"\xda\x00\xff binary", "is not a text file"),
    (b"namespace: [fr3\ngripper: none\n", r"is not valid YAML \(line 2: "),
    (b"arm_joint_names: 7\n", "arm_joint_names=7: a list of joint names"),
    (b"domain_id: true\n", "domain_id=True"),
], ids=["folder", "binary", "yaml-syntax", "joint-names", "bool-domain"])
def test_a_config_file_that_is_not_a_mapping_of_fields_is_named(tmp_path, content, message):
    path = tmp_path / "arm.yaml"
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(ValueError, match=message):
        RosArmConfig.from_file(path)
