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
