"""The camera file: written atomically by the tool, read by the twin's loader (old and new files)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from calibration.camera_file import write_camera_file
from calibration.intrinsics import intrinsics_from_matrix
from calibration.synthetic import look_at
from vla_envs.camera_file import DEFAULT_CAMERA_FILE, load_camera_file

K = [[611.2, 0.0, 318.4], [0.0, 610.9, 242.7], [0.0, 0.0, 1.0]]


def test_round_trip_keeps_arrays_and_report(tmp_path):
    intrinsics = intrinsics_from_matrix(K, [0.01, -0.02, 0.0, 0.0, 0.0], width=640, height=480)
    T = look_at([1.0, -0.4, 0.6], [0.4, 0.0, 0.2])
    report = {"method": "park", "residuals": {"park": {"trans_rms_mm": 0.2}}, "num_samples": 15}
    path = write_camera_file(tmp_path / "camera.json", intrinsics=intrinsics, T_base_from_cam=T, calibration=report)
    cam = load_camera_file(path)
    assert (cam.width, cam.height) == (640, 480)
    np.testing.assert_array_equal(cam.intrinsic, np.array(K))
    np.testing.assert_array_equal(cam.T_base_from_cam, T)
    assert cam.calibration == report
    assert [p.name for p in tmp_path.iterdir()] == ["camera.json"]  # no temporary file left


def test_old_files_without_calibration_still_load():
    cam = load_camera_file(DEFAULT_CAMERA_FILE)
    assert cam.calibration is None and cam.intrinsic.shape == (3, 3)


@pytest.mark.parametrize("change, field", [
    (lambda d: d.pop("intrinsic"), "lacks the field 'intrinsic'"),
    (lambda d: d.update(T_base_from_cam=d["T_base_from_cam"][:3]), "'T_base_from_cam' must be a 4x4"),
    (lambda d: d.update(T_base_from_cam=[row[:3] for row in d["T_base_from_cam"]]), "'T_base_from_cam' must be a 4x4"),
    (lambda d: d.update(intrinsic=[[-600, 0, 320], [0, 600, 240], [0, 0, 1]]), "'intrinsic' must be"),
    (lambda d: d.update(calibration=[1, 2]), "'calibration' must be a JSON object"),
    (lambda d: d.pop("height"), "lacks the field 'height'"),
    (lambda d: d.update(width=True), "'width' must be"),  # JSON true is no image size
])
def test_wrong_or_missing_field_is_named(tmp_path, change, field):
    data = json.loads(DEFAULT_CAMERA_FILE.read_text())
    change(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=field):
        load_camera_file(path)


def test_a_bad_transform_is_never_written_and_the_old_file_stays(tmp_path):
    intrinsics = intrinsics_from_matrix(K, width=640, height=480)
    path = write_camera_file(tmp_path / "camera.json", intrinsics=intrinsics, T_base_from_cam=np.eye(4))
    before = path.read_text()
    with pytest.raises(ValueError, match="T_base_from_cam must be a 4x4"):
        write_camera_file(path, intrinsics=intrinsics, T_base_from_cam=np.eye(4)[:3])
    scaled = np.diag([2.0, 1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="T_base_from_cam is not a rigid transform"):
        write_camera_file(path, intrinsics=intrinsics, T_base_from_cam=scaled)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["camera.json"]


def test_explicit_intrinsics_are_checked():
    with pytest.raises(ValueError, match="'camera_matrix'"):
        intrinsics_from_matrix([[600, 0, 320], [0, 600, 240]], width=640, height=480)
    with pytest.raises(ValueError, match="'dist_coeffs'"):
        intrinsics_from_matrix(K, [0.1, 0.2, 0.3], width=640, height=480)
    with pytest.raises(ValueError, match="'width'"):
        intrinsics_from_matrix(K, width=0, height=480)


def _camera_with_distortion(tmp_path, dist):
    return load_camera_file(write_camera_file(
        tmp_path / "camera.json", intrinsics=intrinsics_from_matrix(K, dist, width=640, height=480),
        T_base_from_cam=look_at([1.0, -0.4, 0.6], [0.4, 0.0, 0.2]), calibration={"dist_coeffs": list(dist)}))


def test_a_real_frame_is_undistorted_into_the_pinhole_picture_the_twin_renders(tmp_path):
    """A board seen through a lens with barrel distortion (made from its pinhole picture with
    OpenCV's own model), undistorted by the camera file: the pinhole picture again, the policy's
    image from it too; the distorted frame is far from it."""
    import cv2

    from calibration.board import BoardSpec
    from calibration.synthetic import BoardRenderer
    from calibration.transforms import make_transform, rotvec_to_matrix
    from vla_envs.backends.franka.twin import twin_image

    dist = [-0.25, 0.08, 0.001, -0.0005, 0.0]
    cam = _camera_with_distortion(tmp_path, dist)
    spec = BoardSpec()
    R = rotvec_to_matrix(np.radians([30.0, 0.0, 10.0]))
    pinhole_gray = BoardRenderer(spec).render(make_transform(R, np.array([0.0, 0.0, 0.45]) - R @ spec.center_m),
                                              intrinsics_from_matrix(K, None, width=640, height=480))
    pinhole = np.repeat(pinhole_gray[..., None], 3, axis=2)
    # the lens: the pixel seen at p shows what the pinhole camera shows at undistort(p)
    u, v = np.meshgrid(np.arange(640, dtype=np.float32), np.arange(480, dtype=np.float32))
    seen = np.stack([u.ravel(), v.ravel()], axis=1)[:, None]
    ideal = cv2.undistortPoints(seen, np.array(K), np.array(dist), P=np.array(K)).reshape(480, 640, 2)
    distorted = cv2.remap(pinhole, ideal[..., 0], ideal[..., 1], cv2.INTER_LINEAR)

    undistort = cam.undistorter()
    assert undistort is not None
    from vla_trainer.deploy.ros_policy_node import resolve_camera  # the ROS 2 policy node's frames too

    assert resolve_camera(None, str(cam.path), None, None)[2] is not None
    inner = (slice(60, 420), slice(80, 560))  # the corners' edges stay black: no lens pixel shows them
    error = lambda image: np.abs(image[inner].astype(float) - pinhole[inner]).mean()  # noqa: E731
    assert error(distorted) > 8.0  # measured 10.0 grey levels
    assert error(undistort(distorted)) < 3.0  # 2.1: bilinear resampling twice
    crop = (120, 60, 520, 420)
    policy_image = lambda frame, fix=None: twin_image(frame, 64, crop, (480, 640), fix).astype(float)  # noqa: E731
    assert np.abs(policy_image(distorted, undistort) - policy_image(pinhole)).mean() < 1.5  # 0.5
    assert np.abs(policy_image(distorted) - policy_image(pinhole)).mean() > 8.0  # 10.0


def test_no_or_negligible_distortion_leaves_frames_alone_and_bad_coefficients_are_refused(tmp_path):
    assert load_camera_file(DEFAULT_CAMERA_FILE).undistorter() is None
    assert _camera_with_distortion(tmp_path, [0.0] * 5).undistorter() is None
    assert _camera_with_distortion(tmp_path, [1e-8, 0.0, 0.0, 0.0, 0.0]).undistorter() is None  # < 0.1 px
    path = tmp_path / "camera.json"
    data = json.loads(path.read_text())
    for bad in ([0.1, 0.2], [0.1, float("nan"), 0, 0, 0], "barrel"):
        data["calibration"]["dist_coeffs"] = bad
        path.write_text(json.dumps(data))
        with pytest.raises(ValueError, match="calibration.dist_coeffs' must hold 4, 5, 8, 12 or 14 finite"):
            load_camera_file(path)
