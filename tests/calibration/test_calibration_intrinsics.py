"""Corner detection accuracy and intrinsics from rendered views with a known camera."""

from __future__ import annotations

import numpy as np
import pytest

from calibration.board import BoardSpec
from calibration.detection import detect_board
from calibration.errors import BoardNotDetectedError, TooFewSamplesError
from calibration.intrinsics import calibrate_intrinsics
from calibration.synthetic import BoardRenderer, default_intrinsics, sample_board_pose

SPEC = BoardSpec()
TRUE = default_intrinsics()


def views(n, seed, intrinsics=TRUE, depth_range_m=(0.3, 0.6), max_tilt_deg=45.0):
    rng = np.random.default_rng(seed)
    renderer = BoardRenderer(SPEC)
    out = []
    for i in range(n):
        T = sample_board_pose(rng, SPEC, intrinsics, depth_range_m, max_tilt_deg=max_tilt_deg)
        out.append((f"{i:03d}.png", renderer.render(T, intrinsics, rng), T))
    return out


def test_corners_are_unbiased_and_sub_pixel():
    """Guards the two detector problems detection.py fixes: the +0.5 px shift of OpenCV before
    the fix of opencv/opencv#25539, and refinement windows that reach into the markers on
    small, tilted boards (up to ~1.5 px)."""
    errors = []
    for name, image, T in views(10, seed=5, depth_range_m=(0.45, 0.9), max_tilt_deg=40.0):
        obs = detect_board(image, SPEC, name)
        p = obs.object_points @ T[:3, :3].T + T[:3, 3]
        uv = (p @ TRUE.camera_matrix.T)[:, :2] / p[:, 2:]
        errors.append(obs.image_points - uv)
    e = np.concatenate(errors)
    assert np.abs(e.mean(axis=0)).max() < 0.03
    assert np.sqrt(np.mean(e ** 2)) < 0.1
    assert np.abs(e).max() < 0.4


def test_blank_image_is_named():
    blank = np.full((480, 640), 105, np.uint8)
    with pytest.raises(BoardNotDetectedError, match="board not detected in 007.png: 0 ChArUco corners") as e:
        detect_board(blank, SPEC, "007.png")
    assert e.value.image == "007.png"
    with pytest.raises(BoardNotDetectedError, match="not an 8-bit"):
        detect_board(np.zeros((480, 640), np.float32), SPEC, "float.png")


def test_intrinsics_from_fifteen_views():
    images = [(name, image) for name, image, _ in views(15, seed=1)]
    result = calibrate_intrinsics(images, SPEC)
    K, K_true = result.intrinsics.camera_matrix, TRUE.camera_matrix
    for (r, c), what in {(0, 0): "fx", (1, 1): "fy", (0, 2): "cx", (1, 2): "cy"}.items():
        assert K[r, c] == pytest.approx(K_true[r, c], rel=0.01), what
    print(f"fx {K[0, 0]:.2f} fy {K[1, 1]:.2f} cx {K[0, 2]:.2f} cy {K[1, 2]:.2f} (true 615, 615, 323.7, 237.1), "
          f"RMS {result.rms_px:.3f} px")
    assert result.rms_px < 0.5
    assert len(result.per_image_rms_px) == 15 and not result.rejected


def test_an_inconsistent_view_is_rejected_and_a_blank_one_skipped():
    images = [(name, image) for name, image, _ in views(12, seed=2)]
    # one view torn in two (the board moved during a rolling-shutter readout): its right half
    # is 3 px off, which no camera pose explains
    (_, odd, _), = views(1, seed=9)
    odd[:, 320:] = np.roll(odd[:, 320:], 3, axis=1)
    images.append(("odd.png", odd))
    images.append(("blank.png", np.full((480, 640), 105, np.uint8)))
    result = calibrate_intrinsics(images, SPEC)
    assert list(result.rejected) == ["odd.png"]
    assert list(result.undetected) == ["blank.png"]
    assert "odd.png" not in result.per_image_rms_px
    assert result.intrinsics.camera_matrix[0, 0] == pytest.approx(615.0, rel=0.01)
    assert result.rms_px < 0.5


def test_too_few_views_and_mixed_sizes():
    images = [(name, image) for name, image, _ in views(4, seed=3)]
    with pytest.raises(TooFewSamplesError, match="found in 4 of 4 images; intrinsics need >= 6"):
        calibrate_intrinsics(images, SPEC)
    with pytest.raises(ValueError, match="image small.png is 320x240 but the first image is 640x480"):
        calibrate_intrinsics(images + [("small.png", np.zeros((240, 320), np.uint8))], SPEC)
