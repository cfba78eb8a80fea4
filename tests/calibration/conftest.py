"""Shared helpers of the calibration tests: rendered board views with known poses.

Everything runs the real OpenCV on images rendered by ``calibration.synthetic``; nothing is
mocked. Rendering dominates the cost (~30 ms a view), so views are made once per module.
"""

from __future__ import annotations

import pytest

pytest.importorskip("cv2", reason="the calibration tool needs OpenCV (the [robot] or [libero] extra)")

from calibration.detection import board_pose, detect_board  # noqa: E402
from calibration.synthetic import BoardRenderer  # noqa: E402


def observe(scene, boards, rng, noise_std=1.5):
    """Render each true ``T_cam_from_board`` and estimate it back (detection + PnP)."""
    renderer = BoardRenderer(scene.spec)
    estimates = []
    for i, T in enumerate(boards):
        image = renderer.render(T, scene.intrinsics, rng, noise_std)
        pose, _ = board_pose(detect_board(image, scene.spec, f"view{i}"), scene.intrinsics.camera_matrix)
        estimates.append(pose)
    return estimates


@pytest.fixture(scope="session")
def observe_views():
    return observe
