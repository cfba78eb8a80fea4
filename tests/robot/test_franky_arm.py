"""FrankyArm against franky-sim over libfranka's real protocol: connecting (and failing to), reading
the state, relative steps in the twin's frames, the gripper, stop and recover."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from real_robot.errors import (DeviceAlreadyConnectedError, DeviceNotConnectedError, MotionError,
                               RobotUnreachableError, SafetyBypassError)
from real_robot.franky_arm import FrankyArm, FrankyArmConfig
from real_robot.transforms import euler_xyz_to_matrix, rotation_angle


def test_features_are_known_while_disconnected():
    arm = FrankyArm(FrankyArmConfig(robot_ip="172.16.0.2"))
    assert not arm.is_connected
    assert arm.observation_features == {"joint_positions_rad": (7,), "gripper_width_m": float,
                                        "tcp_position_m": (3,), "tcp_quaternion_wxyz": (4,)}
    assert set(arm.action_features) == {"translation_m", "rotation_rotvec_rad", "gripper_close"}
    with pytest.raises(DeviceNotConnectedError, match=r"FrankyArm\(172.16.0.2\) is not connected"):
        arm.observation()


@pytest.mark.parametrize("field, value, message", [
    ("robot_ip", "", "robot_ip='': a hostname or IP address"),
    ("robot_ip", "127.0.0.1:1337", "libfranka uses fixed ports"),
    ("relative_dynamics_factor", 0.0, r"relative_dynamics_factor=0.0: a number in \(0, 1\]"),
    ("relative_dynamics_factor", 1.5, r"relative_dynamics_factor=1.5: a number in \(0, 1\]"),
    ("connect_timeout_s", -1, r"connect_timeout_s=-1: a number in \(0, 60\]"),
])
def test_config_refuses_bad_values(field, value, message):
    with pytest.raises(ValueError, match=message):
        FrankyArmConfig(**{"robot_ip": "172.16.0.2", field: value})


def test_connect_and_observation(homed_layer, home_tcp_position_m):
    arm = homed_layer.arm
    obs = arm.observation()
    values = obs.as_dict()
    assert set(values) == set(arm.observation_features)
    for key, feature in arm.observation_features.items():
        assert np.shape(values[key]) == (() if feature is float else feature), key
    # the TCP, not the flange: libfranka's Franka Hand frame, 0.1034 m beyond the flange
    np.testing.assert_allclose(obs.tcp_position_m, home_tcp_position_m, atol=0.003)
    # pointing down with its x axis along the base's x, as the twin's panda_hand_tcp at rest
    assert rotation_angle(obs.T_base_from_tcp[:3, :3].T @ np.diag([1.0, -1.0, -1.0])) < np.radians(1.0)
    np.testing.assert_allclose(abs(obs.tcp_quaternion_wxyz), [0, 1, 0, 0], atol=0.01)
    np.testing.assert_allclose(obs.joint_positions_rad, homed_layer.limits.home_joint_positions_rad, atol=0.05)
    assert 0.0 <= obs.gripper_width_m <= 0.081
    with pytest.raises(DeviceAlreadyConnectedError):
        arm.connect()


def test_relative_translation_moves_the_tcp_by_that_much_in_the_base_frame(homed_layer):
    wanted_m = np.array([0.02, -0.025, 0.015])
    before = homed_layer.observation().T_base_from_tcp
    sent = homed_layer.send_action([*(wanted_m / 0.1), 0, 0, 0, -1])
    after = homed_layer.observation().T_base_from_tcp
    assert sent.clamps == ()
    np.testing.assert_allclose(sent.translation_m, wanted_m, atol=1e-9)
    np.testing.assert_allclose(after[:3, 3] - before[:3, 3], wanted_m, atol=0.002)
    assert rotation_angle(after[:3, :3].T @ before[:3, :3]) < np.radians(0.5)


@pytest.mark.parametrize("rotation_action", [(0, 0, 0.6), (0.5, 0, 0), (0.3, -0.4, 0.5)])
def test_rotation_step_turns_about_the_tcp_with_base_aligned_axes(homed_layer, rotation_action):
    before = homed_layer.observation().T_base_from_tcp
    sent = homed_layer.send_action([0, 0, 0, *rotation_action, -1])
    after = homed_layer.observation().T_base_from_tcp
    # the twin: R_new = euler_xyz(-0.1 * a) @ R_old, the position unchanged
    R_expected = euler_xyz_to_matrix(-0.1 * np.asarray(rotation_action)) @ before[:3, :3]
    assert sent.clamps == ()
    assert rotation_angle(after[:3, :3].T @ R_expected) < np.radians(0.3)
    assert rotation_angle(after[:3, :3].T @ before[:3, :3]) > 0.03  # it did turn
    np.testing.assert_allclose(after[:3, 3], before[:3, 3], atol=0.002)


def test_gripper_closes_and_opens(homed_layer):
    homed_layer.send_action([0, 0, 0, 0, 0, 0, 1.0])
    assert homed_layer.observation().gripper_width_m < 0.005
    homed_layer.send_action([0, 0, 0, 0, 0, 0, -1.0])
    assert homed_layer.observation().gripper_width_m > 0.07


def _width_m(layer) -> float:
    return layer.observation().gripper_width_m


def _wait_for_width(layer, done, seconds=5.0) -> float:
    deadline = time.monotonic() + seconds
    while not done(_width_m(layer)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _width_m(layer)


def test_a_gripper_command_while_the_fingers_move_is_kept_and_the_steps_go_on(layer_factory):
    """Asynchronous steps: opening while the gripper still closes returns at once (the gripper runs one
    command at a time; waiting for it stalled the control loop up to 0.7 s), and the steps after it
    send the kept open once the close has ended."""
    with layer_factory({"wait_for_motion": False}, gripper_min_interval_s=0.0) as layer:
        layer.open_gripper()
        assert _wait_for_width(layer, lambda w: w > 0.0795) > 0.0795
        time.sleep(0.3)  # the open has ended: the close below is sent, not kept
        assert layer.send_action([0, 0, 0, 0, 0, 0, 1.0]).gripper_changed  # close: sent
        assert layer.send_action([0, 0, 0, 0, 0, 0, -1.0]).gripper_changed  # open: kept
        returned = _width_m(layer)
        time.sleep(0.2)
        assert _width_m(layer) < returned - 0.002, "the open waited for the close to end"
        deadline = time.monotonic() + 5.0
        while _width_m(layer) < 0.075 and time.monotonic() < deadline:
            layer.send_action([0, 0, 0, 0, 0, 0, -1.0])  # the policy's steps, the gripper unchanged
            time.sleep(0.1)
        assert _width_m(layer) > 0.075, "the kept open was never sent"


def test_an_episodes_first_open_sends_the_open_kept_while_the_fingers_closed(layer_factory):
    """An open the policy sent while the gripper still closed is kept; the layer records the gripper
    as open. The next episode's ``open_gripper`` must send it, not take the record's word."""
    with layer_factory({"wait_for_motion": False}, gripper_min_interval_s=0.0) as layer:
        layer.open_gripper()
        assert _wait_for_width(layer, lambda w: w > 0.0795) > 0.0795
        time.sleep(0.3)
        layer.send_action([0, 0, 0, 0, 0, 0, 1.0])  # close: sent
        layer.send_action([0, 0, 0, 0, 0, 0, -1.0])  # open: kept while the fingers close
        assert layer.arm.gripper_command_kept
        layer.open_gripper()  # the next episode's start; no step in between
        assert not layer.arm.gripper_command_kept
        assert _wait_for_width(layer, lambda w: w > 0.075) > 0.075, "the episode started with the fingers closed"


def test_motion_commands_without_the_safety_layer_are_refused(homed_layer):
    arm = homed_layer.arm
    before = arm.observation().tcp_position_m
    with pytest.raises(SafetyBypassError, match="through SafetyLayer"):
        arm.move_to_pose(np.eye(4))
    with pytest.raises(SafetyBypassError):
        arm.move_to_pose(np.eye(4), permit=object())
    with pytest.raises(SafetyBypassError):
        arm.set_gripper(True)
    with pytest.raises(SafetyBypassError):
        arm.move_to_joint_positions([0.0] * 7)
    time.sleep(0.2)
    np.testing.assert_allclose(arm.observation().tcp_position_m, before, atol=1e-4)


def test_stop_aborts_a_running_step_and_recover_makes_the_arm_usable(layer_factory, settled):
    # slow synchronous steps, stopped from another thread as an operator's stop would
    with layer_factory({"relative_dynamics_factor": 0.1}) as layer:
        start = layer.observation().tcp_position_m

        def stop_once_moving() -> None:  # not after a fixed time: on a busy machine the motion starts late
            robot, deadline = layer.arm._robot, time.monotonic() + 5.0
            while time.monotonic() < deadline and not robot.is_in_control:  # the motion has begun
                time.sleep(0.002)
            time.sleep(0.1)
            layer.stop()

        stopper = threading.Thread(target=stop_once_moving)
        stopper.start()
        # franky reports the stopped blocking move as "preempted" or, racing the stop, returns
        # early without it: either way the step ends short of its target
        try:
            layer.send_action([0.4, 0, 0, 0, 0, 0, -1])
        except MotionError as e:
            assert "recover" in str(e)
        stopper.join()
        stopped = settled(layer)
        assert stopped[0] - start[0] < 0.035  # stopped before the 4 cm target
        assert layer.recover() is True
        layer.send_action([0, 0.2, 0, 0, 0, 0, -1])
        np.testing.assert_allclose(layer.observation().tcp_position_m - stopped, [0, 0.02, 0], atol=0.002)


def _stop_at_the_arms_permit_check(layer) -> None:
    """The next motion command's permit check (after the layer looked for a stop, before the motion
    starts) stops the layer first: a stop from another thread arriving at that instant."""
    arm, check = layer.arm, layer.arm._check_permit

    def stop_then_check(permit, command):
        del arm._check_permit  # once
        layer.stop()
        check(permit, command)

    arm._check_permit = stop_then_check


def test_a_stop_between_the_layers_check_and_the_motions_start_sends_nothing(layer_factory, settled):
    """The layer's last look for a stop and the motion's start happen under the arm's gate, which a stop
    also takes: a stop arriving in between keeps the step (and the move home) from starting at all."""
    with layer_factory({}) as layer:
        start = settled(layer)
        _stop_at_the_arms_permit_check(layer)
        sent = layer.send_action([0.2, 0, 0, 0, 0, 0, -1])
        assert sent.preempted and not sent.translation_m.any() and not sent.gripper_changed
        time.sleep(0.5)
        assert np.linalg.norm(settled(layer) - start) < 0.001, "the step ran after the stop"
        layer.send_action([0.2, 0, 0, 0, 0, 0, -1])  # the next action moves again
        moved = settled(layer)
        np.testing.assert_allclose(moved - start, [0.02, 0, 0], atol=0.002)
        _stop_at_the_arms_permit_check(layer)
        with pytest.raises(MotionError, match="a stop cut the move home short"):
            layer.home()
        time.sleep(0.5)
        assert np.linalg.norm(settled(layer) - moved) < 0.001, "the arm went home after the stop"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the server's UDP port in /proc")
def test_a_motion_the_robot_ends_out_of_protocol_is_a_motion_error_that_recover_clears(franky_sim, layer_factory):
    """A motion the server reports finished while franky still runs it (as a stray "finished" command
    packet makes it do) raises libfranka's ProtocolException mid-move: it comes out as a MotionError
    naming recover(), not a raw franky exception, and after recover() the arm moves again."""
    from franky_sim_server import send_motion_finished, server_udp_ports
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD

    # no gripper: the robot's connection is then the server's only UDP socket
    with layer_factory({"gripper": False, "relative_dynamics_factor": 0.05},
                       home_joint_positions_rad=TWIN_REST_JOINT_POSITIONS_RAD) as layer:
        (port,) = server_udp_ports(franky_sim)

        def end_once_moving() -> None:
            robot, deadline = layer.arm._robot, time.monotonic() + 5.0
            while time.monotonic() < deadline and not robot.is_in_control:
                time.sleep(0.002)
            time.sleep(0.2)
            send_motion_finished(franky_sim, port)

        ender = threading.Thread(target=end_once_moving)
        ender.start()
        with pytest.raises(MotionError, match=r"ProtocolException.*call recover\(\)"):
            layer.home()  # seconds at 5 % dynamics
        ender.join()
        assert layer.recover() is True
        layer.home()
        np.testing.assert_allclose(layer.observation().joint_positions_rad, TWIN_REST_JOINT_POSITIONS_RAD, atol=0.01)


def test_closed_port_fails_fast_naming_the_address(free_address):
    arm = FrankyArm(FrankyArmConfig(robot_ip=free_address, ignore_realtime=True))
    start = time.monotonic()
    with pytest.raises(RobotUnreachableError, match=f"robot at {free_address}"):
        arm.connect()
    assert time.monotonic() - start < 2.0  # connect_timeout_s is 3 s: the refusal, not the deadline
    assert not arm.is_connected


def test_silent_peer_fails_within_the_connect_timeout(free_address):
    # a host that accepts on libfranka's port and never answers: franky alone would wait forever
    with socket.socket() as listener:
        listener.bind((free_address, 1337))
        listener.listen(4)
        arm = FrankyArm(FrankyArmConfig(robot_ip=free_address, ignore_realtime=True, connect_timeout_s=1.0))
        start = time.monotonic()
        with pytest.raises(RobotUnreachableError, match=f"{free_address}.*connect_timeout_s=1 s"):
            arm.connect()
        elapsed_s = time.monotonic() - start
    assert 1.0 <= elapsed_s < 1.5
    assert not arm.is_connected


def test_missing_franky_names_the_extra(tmp_path):
    code = ("import sys; sys.modules['franky'] = None\n"
            "from real_robot.franky_arm import FrankyArm, FrankyArmConfig\n"
            "FrankyArm(FrankyArmConfig(robot_ip='172.16.0.2')).connect()\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "MissingExtraError" in result.stderr and 'pip install "vla-rl[robot]"' in result.stderr


def test_no_realtime_kernel_is_its_own_error_naming_the_switch(monkeypatch):
    franky = pytest.importorskip("franky", reason="the [robot] extra")
    from real_robot.errors import RealtimeKernelError

    def robot(*args, **kwargs):  # what franky raises on a PC without PREEMPT_RT
        raise franky.RealtimeException("libfranka: Running kernel does not have realtime capabilities.")

    monkeypatch.setattr(franky, "Robot", robot)
    with pytest.raises(RealtimeKernelError, match=r"no realtime kernel.*capabilities.*set ignore_realtime=True") as e:
        FrankyArm(FrankyArmConfig(robot_ip="127.0.0.1", gripper=False)).connect()
    assert e.value.detail == "libfranka: Running kernel does not have realtime capabilities."
