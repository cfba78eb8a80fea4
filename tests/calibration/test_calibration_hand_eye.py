"""Hand-eye: known camera transforms recovered from rendered views, residuals, degenerate inputs."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.errors import InsufficientRotationError, TooFewSamplesError
from calibration.hand_eye import METHODS, Mode, solve_hand_eye
from calibration.synthetic import make_scene
from calibration.transforms import invert, make_transform, rotation_angle_deg, rotvec_to_matrix, transform_difference

SEEDS = range(10)
SAMPLES = 15
MAX_MEDIAN_MM, MAX_MEDIAN_DEG = 1.0, 0.05
PANDA_SHOULDER = np.array([0.0, 0.0, 0.333])
PANDA_REACH_M = 0.855


def errors_over_seeds(scene, observe, seeds, robot_noise_mm=0.1, robot_noise_deg=0.01):
    """Per method, ``[len(seeds), 2]``: (mm, deg) between the solved and the true camera transform."""
    errors = {m: [] for m in METHODS}
    for seed in seeds:
        rng = np.random.default_rng(seed)
        robots, boards = scene.sample(rng, SAMPLES, robot_noise_mm, robot_noise_deg)
        if scene.mode is Mode.EYE_TO_HAND:  # realistic: the flange within the Panda's reach
            reach = [np.linalg.norm(T[:3, 3] - PANDA_SHOULDER) for T in robots]
            assert max(reach) < PANDA_REACH_M and min(T[2, 3] for T in robots) > 0.0
        result = solve_hand_eye(robots, observe(scene, boards, rng), mode=scene.mode, board_point=scene.spec.center_m)
        assert result.passed
        for m in METHODS:
            errors[m].append(transform_difference(scene.T_cam, result.methods[m].T_cam))
    return {m: np.array(e) for m, e in errors.items()}


@pytest.fixture(scope="module", params=["side", "overhead"])
def eye_to_hand_errors(request, observe_views):
    scene = make_scene(request.param)
    return scene, errors_over_seeds(scene, observe_views, SEEDS)


def test_eye_to_hand_recovers_the_camera(eye_to_hand_errors):
    scene, errors = eye_to_hand_errors
    if scene.name == "overhead":  # the case where TSAI breaks down
        assert rotation_angle_deg(scene.T_cam[:3, :3]) > 175.0
    for method, e in errors.items():
        trans_mm, rot_deg = np.median(e, axis=0)
        print(f"{scene.name} {method}: median {trans_mm:.3f} mm {rot_deg:.4f} deg, max {e[:, 0].max():.3f} mm "
              f"{e[:, 1].max():.4f} deg over {len(e)} seeds")
        assert trans_mm < MAX_MEDIAN_MM and rot_deg < MAX_MEDIAN_DEG, method


def test_eye_in_hand_recovers_the_camera(observe_views):
    scene = make_scene("wrist")
    errors = errors_over_seeds(scene, observe_views, range(3))
    for method, e in errors.items():
        trans_mm, rot_deg = np.median(e, axis=0)
        print(f"wrist {method}: median {trans_mm:.3f} mm {rot_deg:.4f} deg over {len(e)} seeds")
        assert trans_mm < MAX_MEDIAN_MM and rot_deg < MAX_MEDIAN_DEG, method


@pytest.mark.parametrize("name", ["side", "overhead", "wrist"])
def test_exact_poses_give_the_exact_answer_and_zero_residuals(name):
    scene = make_scene(name)
    robots, boards = scene.sample(np.random.default_rng(7), 8)
    result = solve_hand_eye(robots, boards, mode=scene.mode, board_point=scene.spec.center_m)
    for method, r in result.methods.items():
        trans_mm, rot_deg = transform_difference(scene.T_cam, r.T_cam)
        assert trans_mm < 1e-3 and rot_deg < 1e-4, method
        assert r.residuals.trans_max_mm < 1e-3 and r.residuals.rot_max_deg < 1e-4, method
        np.testing.assert_allclose(r.T_board, scene.T_board, atol=1e-6)
    assert result.passed and result.chosen in METHODS
    assert set(result.report()["residuals"]) == set(METHODS)


def test_residuals_fail_the_threshold_when_the_board_slips():
    scene = make_scene("side")
    robots, boards = scene.sample(np.random.default_rng(3), 12)
    # the board moved 4 mm on the flange half way through: no single transform explains both halves
    slip = make_transform(np.eye(3), [0.004, 0.0, 0.0])
    boards = [T @ slip if i >= 6 else T for i, T in enumerate(boards)]
    result = solve_hand_eye(robots, boards, mode="eye_to_hand", max_trans_mm=1.0, max_rot_deg=0.5)
    assert not result.passed
    assert result.solution.residuals.trans_rms_mm > 1.0
    assert "FAIL" in result.summary()
    loose = solve_hand_eye(robots, boards, mode="eye_to_hand", max_trans_mm=10.0, max_rot_deg=0.5)
    assert loose.passed and "PASS" in loose.summary()
    fixed = solve_hand_eye(robots, boards, mode="eye_to_hand", method="horaud", max_trans_mm=10.0)
    assert fixed.chosen == "horaud"


def test_too_few_poses():
    scene = make_scene("side")
    robots, boards = scene.sample(np.random.default_rng(0), 4)
    with pytest.raises(TooFewSamplesError, match="4 poses given; hand-eye needs >= 5"):
        solve_hand_eye(robots, boards)


def test_pure_translations_are_rejected():
    rng = np.random.default_rng(0)
    R = rotvec_to_matrix([0.3, -0.2, 0.1])
    robots = [make_transform(R, rng.uniform(-0.2, 0.2, 3) + [0.5, 0.0, 0.3]) for _ in range(10)]
    boards = [make_transform(np.eye(3), [0.0, 0.0, 0.6]) for _ in range(10)]
    with pytest.raises(InsufficientRotationError, match="barely rotate.*Pure translations"):
        solve_hand_eye(robots, boards)


def test_rotations_about_one_axis_are_rejected():
    rng = np.random.default_rng(0)
    axis = np.array([0.0, 0.0, 1.0])
    robots = [make_transform(rotvec_to_matrix(axis * rng.uniform(-1.0, 1.0)), rng.uniform(-0.2, 0.2, 3))
              for _ in range(10)]
    boards = [make_transform(np.eye(3), [0.0, 0.0, 0.6]) for _ in range(10)]
    with pytest.raises(InsufficientRotationError, match="nearly parallel"):
        solve_hand_eye(robots, boards)


def test_one_pose_off_an_otherwise_single_axis_is_not_enough():
    """14 poses rotate about the flange's z axis, one is tilted 6 deg off it: the largest angle between
    two rotation axes reads near 90 deg, yet the translation along z stays poorly determined (1 to 6 mm
    off at 0.3 mm of PnP noise, against 0.5 mm for well-spread poses)."""
    scene = make_scene("side")
    T0 = scene.robot_pose(make_transform(rotvec_to_matrix([0.2, -0.1, 0.3]), [0.0, 0.0, 0.6]))
    rng = np.random.default_rng(0)
    robots = [T0 @ make_transform(rotvec_to_matrix([0.0, 0.0, a]), rng.normal(0, 0.05, 3))
              for a in np.radians(np.linspace(-30, 30, 14))]
    robots.append(T0 @ make_transform(rotvec_to_matrix([np.radians(6.0), 0.0, 0.0]), rng.normal(0, 0.05, 3)))
    boards = [invert(scene.T_cam) @ T @ scene.T_board for T in robots]
    with pytest.raises(InsufficientRotationError, match="nearly parallel"):
        solve_hand_eye(robots, boards)


@pytest.mark.parametrize("name", ["side", "wrist"])
def test_a_board_printed_at_another_scale_fails_naming_the_scale(name):
    """PnP on a board printed 2 % larger than its spec sees every board distance 2 % short; the solution
    absorbs most of it (the camera about 15 mm off along its axis, residuals near 3 mm, under the 5 mm
    limit). The robot's metric motion shows the scale."""
    scene = make_scene(name)
    robots, boards = scene.sample(np.random.default_rng(5), 12)
    exact = solve_hand_eye(robots, boards, mode=scene.mode, board_point=scene.spec.center_m)
    assert exact.passed and abs(exact.board_scale - 1.0) < 1e-4
    seen = [make_transform(T[:3, :3], T[:3, 3] / 1.02) for T in boards]
    result = solve_hand_eye(robots, seen, mode=scene.mode, board_point=scene.spec.center_m / 1.02)
    assert result.solution.residuals.trans_rms_mm < 5.0  # the residuals alone would pass it
    assert not result.passed and abs(result.board_scale - 1.02) < 1e-3, result.board_scale
    assert "+2.00 % the size its spec says" in result.summary() and "measure a printed square" in result.summary()
    assert result.report()["board_scale"] == {"fitted": round(result.board_scale, 5), "max_error": 0.005,
                                              "passed": False}


def test_bad_arguments_are_named():
    scene = make_scene("side")
    robots, boards = scene.sample(np.random.default_rng(0), 6)
    with pytest.raises(ValueError, match="TSAI is left out"):
        solve_hand_eye(robots, boards, method="tsai")
    with pytest.raises(ValueError, match="mode 'eye_on_hand' is not allowed"):
        solve_hand_eye(robots, boards, mode="eye_on_hand")
    with pytest.raises(ValueError, match="6 robot poses but 5 board poses"):
        solve_hand_eye(robots, boards[:5])
    with pytest.raises(ValueError, match="max_trans_mm"):
        solve_hand_eye(robots, boards, max_trans_mm=0)


def test_result_exposes_the_transform_of_its_mode():
    scene = make_scene("wrist")
    robots, boards = scene.sample(np.random.default_rng(1), 6)
    result = solve_hand_eye(robots, boards, mode=scene.mode)
    np.testing.assert_allclose(result.T_ee_from_cam, scene.T_cam, atol=1e-6)
    with pytest.raises(AttributeError, match="eye_in_hand result has T_ee_from_cam"):
        result.T_base_from_cam  # noqa: B018
