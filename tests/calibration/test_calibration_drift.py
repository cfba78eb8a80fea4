"""Drift of the camera against a pinned view of a fixed board, on rendered frames with a known
camera motion (``calibration.synthetic``: the real OpenCV detector on rendered images)."""

from __future__ import annotations

import hashlib
import json

import cv2
import numpy as np
import pytest

from calibration.board import BoardSpec
from calibration.cli import main
from calibration.drift import DriftReference, check_drift
from calibration.errors import BoardNotDetectedError
from calibration.intrinsics import Intrinsics
from calibration.synthetic import BoardRenderer, default_intrinsics, look_at
from calibration.transforms import invert, make_transform, rotation_angle_deg, rotvec_to_matrix

SPEC = BoardSpec()
INTRINSICS = default_intrinsics()
# the board on a stand on the table, 0.5 m in front of the camera, turned 35 deg away from it
R_CAM_FROM_BOARD = rotvec_to_matrix(np.radians([35.0, 0.0, 0.0])) @ rotvec_to_matrix(np.radians([0, 0, 8.0]))
T_CAM_FROM_BOARD = make_transform(R_CAM_FROM_BOARD, np.array([0.02, 0.01, 0.50]) - R_CAM_FROM_BOARD @ SPEC.center_m)
MOVE_MM, MOVE_DEG = 5.0, 0.5
# a bump of the camera: 5 mm along one direction and 0.5 deg about another, in the camera's frame
T_CAMREF_FROM_CAMNOW = make_transform(
    rotvec_to_matrix(np.radians(MOVE_DEG) * np.array([1.0, 2.0, -2.0]) / 3.0),
    MOVE_MM / 1000.0 * np.array([3.0, -4.0, 0.0]) / 5.0)


def write_camera(path, fx=615.0):
    from calibration.camera_file import write_camera_file

    K = INTRINSICS.camera_matrix.copy()
    K[0, 0] = K[1, 1] = fx
    return write_camera_file(path, intrinsics=Intrinsics(640, 480, K),
                             T_base_from_cam=look_at([1.0, -0.4, 0.6], [0.45, 0.0, 0.1]))


def run_cli(args) -> int:
    """``main``'s exit status, including argparse's own exit for a malformed argument."""
    try:
        return main(args)
    except SystemExit as e:
        return e.code


def project(T_cam_from_board):
    p = SPEC.corners_m() @ T_cam_from_board[:3, :3].T + T_cam_from_board[:3, 3]
    uv = p @ INTRINSICS.camera_matrix.T
    return uv[:, :2] / uv[:, 2:]


@pytest.fixture(scope="module")
def scene(tmp_path_factory):
    """Camera file, board.json, a reference pinned through the CLI, and frames: the same view,
    the camera moved, and a frame without the board."""
    root = tmp_path_factory.mktemp("drift")
    renderer = BoardRenderer(SPEC)
    rng = np.random.default_rng(0)
    T_now = invert(T_CAMREF_FROM_CAMNOW) @ T_CAM_FROM_BOARD
    frames = {"ref": T_CAM_FROM_BOARD, "same": T_CAM_FROM_BOARD, "moved": T_now}
    paths = {}
    for name, T in frames.items():
        paths[name] = root / f"{name}.png"
        cv2.imwrite(str(paths[name]), renderer.render(T, INTRINSICS, rng, noise_std=1.5))
    paths["blank"] = root / "blank.png"
    cv2.imwrite(str(paths["blank"]), np.full((480, 640), 105, np.uint8))
    camera = write_camera(root / "camera.json")
    board = SPEC.save(root / "board.json")
    reference = root / "drift_ref"
    assert main(["drift", "pin", "--camera-file", str(camera), "--image", str(paths["ref"]), "--board", str(board),
                 "--out", str(reference)]) == 0
    return {"root": root, "camera": camera, "board": board, "reference": reference, "T_now": T_now, **paths}


def test_pin_stores_the_board_view_and_the_camera_files_hash(scene):
    data = json.loads((scene["reference"] / "reference.json").read_text())
    assert data["format"] == "vla-drift-reference-v1"
    assert data["camera_file_sha256"] == hashlib.sha256(scene["camera"].read_bytes()).hexdigest()
    assert data["camera_file"] == "camera.json" and data["width"] == 640 and data["height"] == 480
    reference = DriftReference.load(scene["reference"])
    assert reference.board == SPEC and len(reference.corner_ids) == 24
    truth = project(T_CAM_FROM_BOARD)[reference.corner_ids]
    assert np.abs(reference.corners_px - truth).max() < 0.3
    trans_m = np.linalg.norm(reference.T_cam_from_board[:3, 3] - T_CAM_FROM_BOARD[:3, 3])
    assert trans_m < 0.003 and rotation_angle_deg(reference.T_cam_from_board[:3, :3].T @ R_CAM_FROM_BOARD) < 0.3
    stored = cv2.imread(str(scene["reference"] / "reference.png"), cv2.IMREAD_GRAYSCALE)
    np.testing.assert_array_equal(stored, cv2.imread(str(scene["ref"]), cv2.IMREAD_GRAYSCALE))


def test_same_view_shows_no_drift(scene):
    report = check_drift(scene["reference"], scene["same"], camera_file=scene["camera"])
    assert report.passed, report.summary()
    assert report.corners == 24 and report.mean_px < 0.05 and report.max_px < 0.15
    assert report.camera_moved_mm < 0.3 and report.camera_rotated_deg < 0.03


def test_moved_camera_is_measured_within_10_percent_and_refused(scene):
    frame = cv2.imread(str(scene["moved"]))  # a frame as the camera delivers it (BGR array)
    report = check_drift(scene["reference"], frame)
    assert report.camera_moved_mm == pytest.approx(MOVE_MM, rel=0.10)
    assert report.camera_rotated_deg == pytest.approx(MOVE_DEG, rel=0.10)
    direction = report.T_camref_from_camnow[:3, 3] / np.linalg.norm(report.T_camref_from_camnow[:3, 3])
    assert np.degrees(np.arccos(direction @ T_CAMREF_FROM_CAMNOW[:3, 3] / (MOVE_MM / 1000))) < 10
    true_px = np.linalg.norm(project(scene["T_now"]) - project(T_CAM_FROM_BOARD), axis=1)
    assert report.mean_px == pytest.approx(true_px.mean(), abs=0.1)
    assert report.max_px == pytest.approx(true_px.max(), abs=0.2)
    assert not report.passed and report.mean_px > 2.0
    assert str(report) == report.summary()
    problems = " | ".join(report.problems)
    assert len(report.problems) == 3, problems
    assert "corners moved" in problems and "camera moved" in problems and "camera turned" in problems


def test_cli_check_refuses_a_moved_camera_unless_overridden(scene, capsys):
    args = ["drift", "check", "--reference", str(scene["reference"]), "--image", str(scene["moved"])]
    assert main(args) == 3
    err = capsys.readouterr().err
    assert "FAIL" in err and "camera moved" in err and "--override" in err
    assert main(args + ["--override"]) == 0
    assert "WARNING: drift check failed and was overridden" in capsys.readouterr().err
    # looser limits than the motion: passes
    assert main(args + ["--max-px", "20", "--max-mm", "10", "--max-deg", "1"]) == 0
    assert "PASS" in capsys.readouterr().out
    assert main(["drift", "check", "--reference", str(scene["reference"]), "--image", str(scene["same"]),
                 "--camera-file", str(scene["camera"])]) == 0


def test_reference_pinned_with_another_camera_file_is_named(scene, capsys):
    other = write_camera(scene["root"] / "recalibrated.json", fx=620.0)
    report = check_drift(scene["reference"], scene["same"], camera_file=other)
    assert not report.passed and report.mean_px < 0.05  # the view is fine; the file is not the pinned one
    assert len(report.problems) == 1 and "camera file mismatch" in report.problems[0]
    assert "camera.json" in report.problems[0] and "recalibrated.json" in report.problems[0]
    assert main(["drift", "check", "--reference", str(scene["reference"]), "--image", str(scene["same"]),
                 "--camera-file", str(other)]) == 3
    assert "camera file mismatch" in capsys.readouterr().err


def test_missing_board_is_named(scene, capsys):
    with pytest.raises(BoardNotDetectedError, match=r"drift check: board not detected in blank\.png.*drift board"):
        check_drift(scene["reference"], scene["blank"])
    assert main(["drift", "check", "--reference", str(scene["reference"]), "--image", str(scene["blank"])]) == 1
    assert "blank.png" in capsys.readouterr().err
    assert main(["drift", "pin", "--camera-file", str(scene["camera"]), "--image", str(scene["blank"]),
                 "--board", str(scene["board"]), "--out", str(scene["root"] / "ref2")]) == 1
    assert "board not detected in blank.png" in capsys.readouterr().err
    assert not (scene["root"] / "ref2" / "reference.json").exists()


@pytest.mark.parametrize("args, named", [
    (["check", "--reference", "{root}", "--image", "{same}"], "--reference"),       # not a reference folder
    (["check", "--reference", "{reference}", "--image", "{board}"], "--image"),     # not an image
    (["check", "--reference", "{reference}", "--image", "{same}", "--max-mm", "0"], "--max-mm"),
    (["pin", "--camera-file", "{board}", "--image", "{ref}", "--board", "{board}", "--out", "{root}/r"],
     "--camera-file"),
    (["pin", "--camera-file", "{camera}", "--image", "{ref}", "--board", "{camera}", "--out", "{root}/r"],
     "--board"),
    (["pin", "--camera-file", "{camera}", "--image", "{ref}", "--board", "{board}", "--out", "{board}"], "--out"),
])
def test_bad_arguments_exit_2_naming_the_argument(scene, args, named, capsys):
    assert run_cli(["drift"] + [a.format(**scene) for a in args]) == 2
    assert f"argument {named}" in capsys.readouterr().err


def test_frame_of_another_size_is_refused(scene):
    small = cv2.resize(cv2.imread(str(scene["same"])), (320, 240))
    with pytest.raises(ValueError, match="320x240.*640x480"):
        check_drift(scene["reference"], small)


@pytest.mark.parametrize("field, index", [("corners_px", (3, 0)), ("camera_matrix", (0, 0)), ("dist_coeffs", (0,))])
def test_a_reference_with_numbers_that_are_not_numbers_is_refused(scene, tmp_path, field, index):
    """A NaN compares False with every limit: a check on it would have passed whatever the camera did."""
    import shutil

    from calibration.drift import DriftReferenceError

    copy = tmp_path / "ref"
    shutil.copytree(scene["reference"], copy)
    data = json.loads((copy / "reference.json").read_text())
    values = np.asarray(data.get(field, np.zeros(5)), dtype=float)
    values[index] = np.nan
    data[field] = values.tolist()
    (copy / "reference.json").write_text(json.dumps(data))
    with pytest.raises(DriftReferenceError, match=field):
        check_drift(copy, scene["moved"])


def test_a_measurement_that_is_not_a_number_fails_the_check(scene):
    import dataclasses

    report = check_drift(scene["reference"], scene["same"], camera_file=scene["camera"])
    assert report.passed
    for name in ("mean_px", "camera_moved_mm", "camera_rotated_deg"):
        assert not dataclasses.replace(report, **{name: float("nan")}).passed, name


def test_the_files_written_are_readable_as_a_plain_write_makes_them(tmp_path):
    """Others read the camera file (a ROS node's user, a container): not owner-only as a temporary
    file is made; a replaced file keeps its mode."""
    import os
    import stat

    from calibration.files import write_json_atomic

    previous = os.umask(0o022)
    try:
        new = write_json_atomic(tmp_path / "camera.json", {"a": 1})
        assert stat.S_IMODE(new.stat().st_mode) == 0o644
        os.chmod(new, 0o640)
        write_json_atomic(new, {"a": 2})
        assert stat.S_IMODE(new.stat().st_mode) == 0o640 and json.loads(new.read_text()) == {"a": 2}
    finally:
        os.umask(previous)
