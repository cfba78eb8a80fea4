"""Parity with the twin, the test that makes the zero-shot claim honest: the same 20 actions from
the same joint configuration, run in the ManiSkill Panda twin (``PutOnPlateInScene25Main-v3``) and
through ``FrankaBackend`` -> ``SafetyLayer`` -> an ``Arm`` on franky-sim give the same ``state`` (the
twin's layout: joints, fingers, TCP pose in the twin's world) after every step. Both arms: ``FrankyArm``
(franky over the real libfranka protocol) and ``RosArm`` (ROS 2 topics of a franka_ros2-style stack,
``ros_franka_stack.py``, which drives franky-sim the same way).

The camera is the one thing no real component can stand in for here without a cost that has
nothing to do with parity (a RealSense playback runs out after its recorded seconds):
``StillCamera`` serves one synthetic frame through the real ``Camera`` base class.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import pytest

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]

# translations, rotations about each axis, the gripper, and mixes; from the twin's rest pose they
# stay inside the box below
ACTIONS = np.array([
    [0.5, 0, 0, 0, 0, 0, -1], [0, 0.5, 0, 0, 0, 0, -1], [0, 0, 0.5, 0, 0, 0, -1],
    [-0.5, 0, 0, 0, 0, 0, -1], [0, -0.5, 0, 0, 0, 0, -1], [0, 0, -0.5, 0, 0, 0, -1],
    [0, 0, 0, 0.5, 0, 0, -1], [0, 0, 0, -0.5, 0, 0, -1], [0, 0, 0, 0, 0.5, 0, -1], [0, 0, 0, 0, -0.5, 0, -1],
    [0, 0, 0, 0, 0, 0.7, -1], [0, 0, 0, 0, 0, -0.7, -1],
    [0, 0, 0, 0, 0, 0, 1], [0.3, 0.3, 0.3, 0, 0, 0, 1], [-0.3, -0.3, -0.3, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, -1],
    [0.4, -0.2, 0.2, 0.2, -0.2, 0.3, -1], [-0.4, 0.2, -0.2, -0.2, 0.2, -0.3, -1],
    [1.0, 0, 0, 0, 0, 0, -1], [-1.0, 0, 0, 0, 0, 0, -1],
], np.float32)
POSITION_TOL_M = 0.01
ROTATION_TOL_DEG = 3.0


@pytest.fixture(scope="module")
def twin() -> list[np.ndarray]:
    """The twin's state before and after each action."""
    import gymnasium as gym

    import vla_envs  # noqa: F401

    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=32, low_poly=True, assets="procedural",
                   vectorization="serial")
    try:
        obs, _ = env.reset(seed=0)
        states = [obs["state"][0].copy()]
        for a in ACTIONS:
            obs, *_ = env.step(a[None])
            states.append(obs["state"][0].copy())
        return states
    finally:
        env.close()


@contextlib.contextmanager
def _arm(kind: str, host: str, log_dir):
    """An unconnected arm on the franky-sim at ``host``: franky directly, or through ROS 2."""
    if kind == "franky":
        from real_robot.franky_arm import FrankyArm, FrankyArmConfig

        yield FrankyArm(FrankyArmConfig(robot_ip=host, ignore_realtime=True, relative_dynamics_factor=0.5))
        return
    import os

    from real_robot.ros_arm import RosArm
    from ros_franka_stack import ros_arm_config, start_stack

    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the realtime priority franky left here
    with start_stack(host, log_dir / "ros_stack.log"):
        yield RosArm(ros_arm_config())


def _real_states(arm) -> tuple[list[np.ndarray], list]:
    from real_robot.safety import SafetyLayer, SafetyLimits
    from still_camera import StillCamera
    from vla_envs.backends.franka.backend import FrankaBackend
    from vla_envs.backends.franka.operator import ScriptedOperator
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD
    from vla_envs.core import ChunkVectorEnv

    limits = SafetyLimits(workspace_min_m=(0.35, -0.3, 0.05), workspace_max_m=(0.85, 0.3, 0.5),
                          max_translation_per_step_m=0.15, max_rotation_per_step_rad=0.15,
                          max_relative_dynamics_factor=0.5, gripper_min_interval_s=0.0, watchdog_timeout_s=10.0,
                          home_joint_positions_rad=TWIN_REST_JOINT_POSITIONS_RAD)
    arm.connect()
    camera = StillCamera(48, 64)
    camera.connect()
    backend = FrankaBackend(SafetyLayer(arm, limits), camera, instruction="put carrot on plate", image_size=32,
                            time_limit=100, operator=ScriptedOperator(), max_frame_age_ms=1000)
    env = ChunkVectorEnv(backend, auto_reset=False)
    try:
        obs, _ = env.reset(seed=0)
        time.sleep(0.5)  # franky-sim's joints lag its command: let the home pose settle
        obs, *_ = env.step(np.zeros((1, 7), np.float32) + np.array([0, 0, 0, 0, 0, 0, -1], np.float32))
        states, sent = [obs["state"][0].copy()], []
        for a in ACTIONS:
            obs, *_ = env.step(a[None])
            states.append(obs["state"][0].copy())
            sent.append(backend.last_sent)
        return states, sent
    finally:
        env.close()


def _angle_deg(q1: np.ndarray, q2: np.ndarray) -> float:
    return float(np.degrees(2 * np.arccos(np.clip(abs(np.dot(q1 / np.linalg.norm(q1), q2 / np.linalg.norm(q2))), 0, 1))))


@pytest.mark.parametrize("arm_kind", ["franky", "ros"])
def test_the_twin_and_the_real_arm_agree_step_by_step(franky_sim, twin, arm_kind, tmp_path):
    if arm_kind == "ros":
        pytest.importorskip("rclpy", reason="the ros extra: bash scripts/setup.sh dev,robot,ros")
    with _arm(arm_kind, franky_sim, tmp_path) as arm:
        real, sent = _real_states(arm)
    np.testing.assert_allclose(real[0][:7], twin[0][:7], atol=0.01)  # the same joint configuration
    rows = []
    for k, (t, r) in enumerate(zip(twin, real)):
        dp = float(np.linalg.norm(t[9:12] - r[9:12]))
        dr = _angle_deg(t[12:16], r[12:16])
        rows.append((k, round(dp * 1000, 1), round(dr, 2), round(float(t[7] + t[8]), 3), round(float(r[7] + r[8]), 3)))
    report = "\n".join(f"step {k:2d}: {mm} mm, {deg} deg, fingers twin {ft} real {fr}" for k, mm, deg, ft, fr in rows)
    for k, mm, deg, ft, fr in rows:
        assert mm <= POSITION_TOL_M * 1000, report
        assert deg <= ROTATION_TOL_DEG, report
    # the same gripper state: closed after the close commands, open after the open ones
    for k in range(2, len(ACTIONS) + 1):  # state k follows action k - 1
        command, before = ACTIONS[k - 1, 6], ACTIONS[k - 2, 6]
        if command != before:
            continue  # the step right after a change: the fingers are still on their way
        closed_twin, closed_real = twin[k][7] + twin[k][8] < 0.04, real[k][7] + real[k][8] < 0.04
        assert closed_twin == closed_real == (command > 0), report
    # the quaternion keeps the twin's sign (continuity near its rest orientation), never flipped
    assert all(np.dot(t[12:16], r[12:16]) > 0 for t, r in zip(twin, real)), report
    assert not any(s.clamps for s in sent), [s.clamps for s in sent]


def test_the_tracking_gain_is_what_the_twin_reaches(twin):
    """``TWIN_TRACKING_GAIN`` (the share of a target the twin reaches in one step) measured anew:
    pure translations along each base axis, from the twin's own states."""
    from vla_envs.backends.franka.twin import T_WORLD_FROM_BASE, TWIN_TRACKING_GAIN

    R_base_from_world = T_WORLD_FROM_BASE[:3, :3].T
    for k, a in enumerate(ACTIONS):
        axes = np.flatnonzero(a[:6])
        if len(axes) != 1 or axes[0] >= 3:
            continue
        moved = R_base_from_world @ (twin[k + 1][9:12] - twin[k][9:12])
        fraction = moved[axes[0]] / (a[axes[0]] * 0.1)
        assert abs(fraction - TWIN_TRACKING_GAIN[axes[0]]) < 0.04, (k, a, fraction)
