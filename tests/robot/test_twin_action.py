"""The twin's action convention: hand-computed cases, the round trip, and the check against ManiSkill's
own ``pd_ee_delta_pose`` controller on the real simulator."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from real_robot.transforms import (matrix_to_euler_xyz, matrix_to_quaternion_wxyz,
                                   matrix_to_rotvec, quaternion_wxyz_to_matrix, rotation_angle, rotvec_to_matrix)
from real_robot.twin_action import action_to_step, step_to_action


def Rz(angle):
    c, s = math.cos(angle), math.sin(angle)
    return np.array([[c, -s, 0], [s, c, 0], [0, 0, 1]])


def test_translation_is_0_1_m_per_unit_in_the_base_frame():
    t, R, close, clipped = action_to_step([1.0, -0.5, 0.25, 0, 0, 0, -1])
    np.testing.assert_allclose(t, [0.1, -0.05, 0.025])
    np.testing.assert_allclose(R, np.eye(3))
    assert not close and not clipped


def test_rotation_is_minus_0_1_rad_per_unit():
    # ManiSkill scales the rotation by rot_lower = -0.1: +1 about z turns the TCP by -0.1 rad
    _, R, _, _ = action_to_step([0, 0, 0, 0, 0, 1.0, 0])
    np.testing.assert_allclose(R, Rz(-0.1), atol=1e-12)


def test_rotation_is_clipped_by_norm_translation_per_component():
    t, R, close, clipped = action_to_step([3.0, -2.0, 0.5, 3.0, 4.0, 0.0, 5.0])
    np.testing.assert_allclose(t, [0.1, -0.1, 0.05])
    np.testing.assert_allclose(matrix_to_euler_xyz(R), [-0.06, -0.08, 0.0], atol=1e-12)
    assert close and clipped


def test_gripper_positive_closes():
    assert action_to_step([0] * 6 + [0.01])[2] is True
    assert action_to_step([0] * 6 + [0.0])[2] is False
    assert action_to_step([0] * 6 + [-1.0])[2] is False


@settings(max_examples=200, deadline=None)
@given(action=st.tuples(*[st.floats(-1, 1)] * 6).filter(lambda a: np.linalg.norm(a[3:]) <= 1.0),
       close=st.booleans())
def test_step_to_action_inverts_action_to_step(action, close):
    t, R, _, _ = action_to_step([*action, 1.0 if close else -1.0])
    back = step_to_action(t, R, close)
    np.testing.assert_allclose(back[:6], action, atol=1e-5)
    assert back[6] == (1.0 if close else -1.0)


@settings(max_examples=200, deadline=None)
@given(rotvec=st.tuples(*[st.floats(-3.1, 3.1)] * 3).filter(lambda v: np.linalg.norm(v) < 3.1))
def test_rotation_conversions_round_trip(rotvec):
    R = rotvec_to_matrix(rotvec)
    np.testing.assert_allclose(R @ R.T, np.eye(3), atol=1e-12)
    np.testing.assert_allclose(rotvec_to_matrix(matrix_to_rotvec(R)), R, atol=1e-9)
    np.testing.assert_allclose(quaternion_wxyz_to_matrix(matrix_to_quaternion_wxyz(R)), R, atol=1e-9)
    assert rotation_angle(R) == pytest.approx(np.linalg.norm(rotvec), abs=1e-6)


@pytest.mark.maniskill
def test_matches_maniskills_pd_ee_delta_pose_controller():
    """The target the twin's own controller computes from the same action and TCP pose."""
    pytest.importorskip("mani_skill")
    import gymnasium as gym
    import mani_skill.envs  # noqa: F401  (registers the tasks)

    env = gym.make("PickCube-v1", obs_mode="state", control_mode="pd_ee_delta_pose", sim_backend="cpu",
                   render_mode=None)
    try:
        env.reset(seed=0)
        arm = env.unwrapped.agent.controller.controllers["arm"]
        rng = np.random.default_rng(0)
        actions = [[0.3, -0.2, 0.1, 0.5, -0.3, 0.8, -1], [0, 0, 0, 0.9, 0.9, 0.0, 1],  # rotation norm > 1
                   *rng.uniform(-1, 1, (4, 7))]
        for action in actions:
            before = arm.ee_pose_at_base
            p_before = before.p[0].numpy().astype(np.float64)
            R_before = quaternion_wxyz_to_matrix(before.q[0].numpy())
            # our gripper sign is the project's (+1 close); the arm part is what is compared
            env.step(np.asarray(action, dtype=np.float32))
            target = arm._target_pose
            t, R_delta, _, _ = action_to_step(action)
            np.testing.assert_allclose(target.p[0].numpy(), p_before + t, atol=1e-5)
            R_target = quaternion_wxyz_to_matrix(target.q[0].numpy())
            assert rotation_angle(R_target.T @ (R_delta @ R_before)) < 1e-5
    finally:
        env.close()


@pytest.mark.parametrize("bad", [[np.inf, -np.inf, 0, 0, 0, 0, 1], [0, 0, 0, np.inf, 0, 0, -1],
                                 [0, 0, np.nan, 0, 0, 0, 1], [0, 0, 0, 0, 0, 0, -np.inf]])
def test_a_non_finite_action_stays_non_finite_through_the_tracking_gain(bad):
    """The policy node scales each action before the bridge's safety layer sees it: clipping an
    infinite translation to 1 would turn a policy fault into a full step instead of a stop."""
    from vla_envs.backends.franka.twin import twin_scaled_action

    scaled = twin_scaled_action(np.array(bad))
    np.testing.assert_array_equal(np.isfinite(scaled), np.isfinite(bad))
