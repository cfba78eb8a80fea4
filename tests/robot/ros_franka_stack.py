"""A franka_ros2-style ROS 2 stack over franky-sim, for testing ``RosArm`` without a robot PC.

It stands in for the robot side of ROS only (franka_ros2's hardware interface and controllers cannot
be built here): it publishes what franka_ros2's broadcasters publish, under their default names, and
executes the commands a Cartesian pose controller, a joint trajectory controller and a gripper
service take, by driving franky-sim over the real libfranka protocol:

- ``/joint_states`` (``fr3_joint1..7`` measured, ``fr3_finger_joint1/2`` = half the gripper width, as
  franka_ros2's joint_state_publisher joins them), the same split as the arm's and the gripper's own
  (``/franka/joint_states``, ``/fr3_gripper/joint_states``), and
  ``/franka_robot_state_broadcaster/current_pose`` (the TCP from the measured joints), at ``--rate-hz``;
- ``/cartesian_impedance_controller/target_pose`` -> an absolute franky ``CartesianMotion``;
- ``/fr3_arm_controller/joint_trajectory`` -> a franky ``JointMotion`` to its last point;
- the gripper as franka_ros2's gripper node serves it: ``/fr3_gripper/grasp`` and ``/fr3_gripper/move``
  (``franka_msgs`` actions), ``/fr3_gripper/gripper_action`` (``control_msgs/GripperCommand``: width =
  2 x position, out of [0, max width] aborted, closing = a grasp that fails when it stops wide of
  its target, as franka_gripper's); and ``/fr3_gripper/close`` (``std_srvs/SetBool``), a simpler one;
- ``/action_server/error_recovery`` (``franka_msgs/ErrorRecovery``) -> franky's error recovery.

``franka_msgs`` and ``control_msgs`` are the tests' builds (``ros_interfaces/``).

    python tests/robot/ros_franka_stack.py --host 127.0.0.5 [--relative-dynamics 0.5]

``start_stack`` runs it as a process with its own DDS domain; SIGTERM stops it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
FINGERS = ["fr3_finger_joint1", "fr3_finger_joint2"]
DOMAIN_ID = 30 + os.getpid() % 100  # a DDS domain of this test process, apart from test_ros_nodes' 150-229


def ros_arm_config(**overrides):
    """The ``RosArmConfig`` of a robot PC running this stack: franka_ros2's default names, gripper and
    error recovery action (the config's defaults).

    Steps wait up to 5 s to arrive (a robot's default is 1 s): on a machine whose cores the rest of
    the suite keeps busy, franky-sim and this stand-in fall behind real time, and a 5 cm step then took
    over 1 s; a step cut short is carried on from where the TCP is, which the parity test would read
    as drift. For the same reason the state may be up to 1 s old (a robot's default 0.25 s): the
    stand-in's publisher, on that machine, once paused 0.5 s mid-run. The test of stale state sets
    its own."""
    from real_robot.ros_arm import RosArmConfig

    return RosArmConfig(**{"domain_id": DOMAIN_ID, "relative_dynamics_factor": 0.5, "connect_timeout_s": 30.0,
                           "settle_timeout_s": 5.0, "state_timeout_s": 1.0, **overrides})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--host", required=True)
    p.add_argument("--relative-dynamics", type=float, default=0.5)
    p.add_argument("--rate-hz", type=float, default=100.0)
    args = p.parse_args(argv)

    import franky
    import numpy as np
    import rclpy
    from control_msgs.action import GripperCommand
    from franka_msgs.action import ErrorRecovery, Grasp, Move
    from geometry_msgs.msg import PoseStamped
    from rclpy.action import ActionServer
    from rclpy.callback_groups import MutuallyExclusiveCallbackGroup
    from rclpy.executors import MultiThreadedExecutor
    from sensor_msgs.msg import JointState
    from std_srvs.srv import SetBool
    from trajectory_msgs.msg import JointTrajectory

    robot = franky.Robot(args.host, relative_dynamics_factor=args.relative_dynamics,
                         realtime_config=franky.RealtimeConfig.Ignore)
    gripper = franky.Gripper(args.host)
    # libfranka made this thread SCHED_FIFO 99; the ROS threads started below must not inherit it
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    motion_lock = threading.Lock()

    rclpy.init()
    node = rclpy.create_node("franka_ros2_stand_in")
    joints_pub = node.create_publisher(JointState, "/joint_states", 10)
    arm_pub = node.create_publisher(JointState, "/franka/joint_states", 10)
    fingers_pub = node.create_publisher(JointState, "/fr3_gripper/joint_states", 10)
    pose_pub = node.create_publisher(PoseStamped, "/franka_robot_state_broadcaster/current_pose", 10)

    def publish_state() -> None:
        state = robot.state
        T = np.asarray(robot.model.pose(franky.Frame.EndEffector, state).matrix)
        stamp = node.get_clock().now().to_msg()
        half = float(gripper.width) / 2
        arm_names, arm_q = [f"fr3_joint{i}" for i in range(1, 8)], [float(v) for v in state.q]
        for pub, names, position in ((joints_pub, arm_names + FINGERS, arm_q + [half, half]),
                                     (arm_pub, arm_names, arm_q), (fingers_pub, FINGERS, [half, half])):
            msg = JointState(name=names, position=position)
            msg.header.stamp, msg.header.frame_id = stamp, "base"
            pub.publish(msg)
        pose = PoseStamped()
        pose.header.stamp, pose.header.frame_id = stamp, "base"
        pose.pose.position.x, pose.pose.position.y, pose.pose.position.z = (float(v) for v in T[:3, 3])
        from real_robot.transforms import matrix_to_quaternion_wxyz

        w, x, y, z = (float(v) for v in matrix_to_quaternion_wxyz(T[:3, :3]))
        pose.pose.orientation.w, pose.pose.orientation.x, pose.pose.orientation.y, pose.pose.orientation.z = w, x, y, z
        pose_pub.publish(pose)

    def move(motion) -> None:
        with motion_lock:
            try:
                robot.move(motion, asynchronous=True)
            except (franky.ControlException, franky.InvalidMotionTypeException) as e:
                # a replaced motion's "preempted", or a joint move replacing a Cartesian one (franky
                # cannot switch types mid-motion): end the running motion, clear, start this one
                node.get_logger().info(f"motion: {e}")
                robot.stop()
                for _ in range(300):  # join without blocking: franky's blocking join keeps the GIL (state stalls)
                    try:
                        if robot.join_motion(0.0):
                            break
                    except franky.ControlException:  # the stopped motion's "preempted": it has ended
                        break
                    time.sleep(0.01)
                robot.recover_from_errors()
                robot.move(motion, asynchronous=True)

    def on_target(msg: PoseStamped) -> None:
        p, o = msg.pose.position, msg.pose.orientation
        desired = np.asarray(robot.current_cartesian_state.pose.end_effector_pose.matrix)
        target = np.array([p.x, p.y, p.z])
        if np.linalg.norm(target - desired[:3, 3]) < 1e-5 and abs(abs(np.dot(
                [o.w, o.x, o.y, o.z], _quat(desired))) - 1) < 1e-10:
            return  # franky's planner fails on an empty motion
        move(franky.CartesianMotion(franky.Affine(target, np.array([o.x, o.y, o.z, o.w])),
                                    franky.ReferenceType.Absolute))

    def on_trajectory(msg: JointTrajectory) -> None:
        index = {n: i for i, n in enumerate(msg.joint_names)}
        last = msg.points[-1].positions
        move(franky.JointMotion(np.array([last[index[f"fr3_joint{i}"]] for i in range(1, 8)])))

    def finished(future) -> bool:
        while not future.wait(0.0):  # franky's blocking calls keep the GIL: poll, and let the state flow
            time.sleep(0.01)
        try:
            return bool(future.get())
        except (franky.CommandException, franky.GripperException) as e:  # refused, e.g. a width it cannot reach
            node.get_logger().warning(f"gripper: {e}")
            return False

    def on_close(request, response):
        response.success = finished(gripper.grasp_async(0.0, 0.05, 20.0, epsilon_inner=0.005, epsilon_outer=1.0)
                                    if request.data else gripper.open_async(0.05))
        return response

    def franka_gripper_result(goal_handle, ok: bool, result):
        if ok:
            goal_handle.succeed()
        else:
            goal_handle.abort()
        return result

    def on_grasp(goal_handle):
        g = goal_handle.request
        ok = finished(gripper.grasp_async(g.width, g.speed, g.force, epsilon_inner=g.epsilon.inner,
                                          epsilon_outer=g.epsilon.outer))
        return franka_gripper_result(goal_handle, ok, Grasp.Result(success=ok, error="" if ok else "grasp failed"))

    def on_move(goal_handle):
        ok = finished(gripper.move_async(goal_handle.request.width, goal_handle.request.speed))
        return franka_gripper_result(goal_handle, ok, Move.Result(success=ok, error="" if ok else "move failed"))

    def on_gripper_command(goal_handle):
        command, width = goal_handle.request.command, float(gripper.width)
        target = 2 * command.position  # position is one finger's
        if not 0 <= target <= gripper.max_width:
            ok = False
        elif abs(target - width) < 1e-4:
            ok = True
        elif target >= width:
            ok = finished(gripper.move_async(target, 0.1))
        else:
            ok = finished(gripper.grasp_async(target, 0.1, command.max_effort, epsilon_inner=0.005,
                                              epsilon_outer=0.005))
        return franka_gripper_result(goal_handle, ok, GripperCommand.Result(position=float(gripper.width),
                                                                            reached_goal=ok))

    def on_error_recovery(goal_handle):
        with motion_lock:
            try:
                robot.recover_from_errors()
            except franky.CommandException as e:
                node.get_logger().warning(f"error recovery: {e}")
                goal_handle.abort()
                return ErrorRecovery.Result()
        goal_handle.succeed()
        return ErrorRecovery.Result()

    def _quat(T):
        from real_robot.transforms import matrix_to_quaternion_wxyz

        return matrix_to_quaternion_wxyz(T[:3, :3])

    # state, motions and the gripper each in a group of their own: a motion that waits for franky to
    # end the previous one, or a grasp, must not hold up the state stream
    motions = MutuallyExclusiveCallbackGroup()
    node.create_subscription(PoseStamped, "/cartesian_impedance_controller/target_pose", on_target, 10,
                             callback_group=motions)
    node.create_subscription(JointTrajectory, "/fr3_arm_controller/joint_trajectory", on_trajectory, 10,
                             callback_group=motions)
    grippers = MutuallyExclusiveCallbackGroup()  # one gripper command at a time, as libfranka's gripper
    node.create_service(SetBool, "/fr3_gripper/close", on_close, callback_group=grippers)
    for action_type, name, execute in ((Grasp, "/fr3_gripper/grasp", on_grasp), (Move, "/fr3_gripper/move", on_move),
                                       (GripperCommand, "/fr3_gripper/gripper_action", on_gripper_command)):
        ActionServer(node, action_type, name, execute, callback_group=grippers)
    ActionServer(node, ErrorRecovery, "/action_server/error_recovery", on_error_recovery,
                 callback_group=MutuallyExclusiveCallbackGroup())
    node.create_timer(1.0 / args.rate_hz, publish_state, callback_group=MutuallyExclusiveCallbackGroup())
    executor = MultiThreadedExecutor(num_threads=4)
    executor.add_node(node)
    signal.signal(signal.SIGTERM, lambda *_: executor.shutdown(timeout_sec=0))
    print("serving", flush=True)
    try:
        executor.spin()
    except (KeyboardInterrupt, rclpy.executors.ExternalShutdownException):
        pass
    finally:
        robot.stop()
    return 0


@contextlib.contextmanager
def start_stack(host: str, log_path: Path, relative_dynamics: float = 0.5):
    """Run the stand-in against the franky-sim at ``host`` in ``DOMAIN_ID``; stop it after."""
    from franky_sim_server import die_with_parent, stop_process
    from real_robot.nodes.spec import local_ros_env

    env = {**os.environ, **local_ros_env(DOMAIN_ID), "PYTHONPATH": str(HERE.parents[1])}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([sys.executable, str(HERE / "ros_franka_stack.py"), "--host", host,
                                 "--relative-dynamics", str(relative_dynamics)], env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent)
    try:
        yield proc
    finally:
        stop_process(proc)


if __name__ == "__main__":
    sys.exit(main())
