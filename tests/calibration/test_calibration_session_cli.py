"""The session folder and ``vla-calibrate`` end to end on rendered sessions."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from calibration.cli import main
from calibration.errors import BoardNotDetectedError, SessionFormatError, TooFewSamplesError
from calibration.hand_eye import METHODS
from calibration.session import load_session, solve_session
from calibration.synthetic import make_scene, write_synthetic_session
from calibration.transforms import transform_difference
from vla_envs.camera_file import load_camera_file


@pytest.fixture(scope="module")
def session(tmp_path_factory):
    """A rendered eye-to-hand session of 10 samples (copied by tests that change it)."""
    folder = tmp_path_factory.mktemp("sessions") / "side"
    scene = make_scene("side")
    write_synthetic_session(folder, scene, np.random.default_rng(11), n=10, robot_noise_mm=0.1, robot_noise_deg=0.01)
    return folder, scene


def copy(session, tmp_path):
    folder = tmp_path / "session"
    shutil.copytree(session[0], folder)
    return folder


def test_handeye_writes_a_camera_file_the_twin_reads(session, tmp_path, capsys):
    folder, scene = session
    out = tmp_path / "calib" / "camera.json"
    assert main(["handeye", "--session", str(folder), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and all(m in printed for m in METHODS)
    cam = load_camera_file(out)
    trans_mm, rot_deg = transform_difference(scene.T_cam, cam.T_base_from_cam)
    assert trans_mm < 1.5 and rot_deg < 0.1
    np.testing.assert_array_equal(cam.intrinsic, scene.intrinsics.camera_matrix)
    assert (cam.width, cam.height) == (640, 480)
    report = cam.calibration
    assert report["num_samples"] == 10 and report["mode"] == "eye_to_hand" and report["passed"]
    assert report["method"] in METHODS and set(report["residuals"]) == set(METHODS)
    assert report["board"]["square_length_m"] == scene.spec.square_length_m
    assert report["image_size"] == [640, 480] and report["date"][:2] == "20"
    assert np.asarray(report["T_ee_from_board"]).shape == (4, 4)
    plot = out.with_name("camera_residuals.png")  # the residuals per sample and method, as a picture
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and plot.stat().st_size > 10_000


def test_failing_residuals_exit_3_unless_accepted(session, tmp_path, capsys):
    out = tmp_path / "camera.json"
    args = ["handeye", "--session", str(session[0]), "--out", str(out), "--max-trans-mm", "0.001"]
    assert main(args) == 3
    assert "not written" in capsys.readouterr().err and not out.exists()
    # the failed run's plot goes apart: the plot beside a camera file is the one of its solution
    assert not out.with_name("camera_residuals.png").exists() and out.with_name("camera_residuals_failed.png").exists()
    assert main(args + ["--accept", "--method", "park"]) == 0
    report = load_camera_file(out).calibration
    assert report["accepted_despite_failure"] and not report["passed"] and report["method"] == "park"
    good = out.with_name("camera_residuals.png").read_bytes()
    assert main(args) == 3  # a later failed run leaves the written file and its plot alone
    assert out.with_name("camera_residuals.png").read_bytes() == good
    assert load_camera_file(out).calibration["accepted_despite_failure"]


def test_an_output_path_that_cannot_be_written_is_refused_before_solving(session, tmp_path, capsys):
    folder = tmp_path / "a_folder"
    folder.mkdir()
    a_file = tmp_path / "camera.json"
    a_file.write_text("{}")
    for out in (folder, a_file / "x.json", a_file / "deeper" / "x.json"):
        assert main(["handeye", "--session", str(session[0]), "--out", str(out)]) == 2
        err = capsys.readouterr()
        assert "--out" in err.err and "Traceback" not in err.err and "residuals" not in err.out, err
    board = session[1].spec.save(tmp_path / "board.json")
    assert main(["intrinsics", "--images", str(tmp_path), "--board", str(board), "--out", str(folder)]) == 2
    assert "is a folder" in capsys.readouterr().err


def test_a_blank_image_is_named(session, tmp_path, capsys):
    import cv2

    folder = copy(session, tmp_path)
    cv2.imwrite(str(folder / "images" / "003.png"), np.full((480, 640), 105, np.uint8))
    with pytest.raises(BoardNotDetectedError, match="board not detected in images/003.png"):
        solve_session(folder)
    assert main(["handeye", "--session", str(folder), "--out", str(tmp_path / "c.json")]) == 1
    assert "images/003.png" in capsys.readouterr().err


def test_too_few_samples(session, tmp_path):
    folder = copy(session, tmp_path)
    for name in ("004", "005", "006", "007", "008", "009"):
        (folder / "images" / f"{name}.png").unlink()
        (folder / "poses" / f"{name}.json").unlink()
    with pytest.raises(TooFewSamplesError, match="has 4 samples; hand-eye needs >= 5"):
        solve_session(folder)


def test_session_format_errors_name_the_file(session, tmp_path):
    folder = copy(session, tmp_path)
    assert len(load_session(folder).samples) == 10
    (folder / "poses" / "002.json").write_text(json.dumps({"T_base_from_ee": np.eye(4)[:3].tolist()}))
    with pytest.raises(SessionFormatError, match=r"002.json field 'T_base_from_ee' must be a 4x4"):
        load_session(folder)
    (folder / "poses" / "002.json").unlink()
    with pytest.raises(SessionFormatError, match="images without a pose .*: 002"):
        load_session(folder)
    meta = json.loads((folder / "session.json").read_text())
    meta["mode"] = "eye_on_hand"
    (folder / "session.json").write_text(json.dumps(meta))
    with pytest.raises(SessionFormatError, match="mode 'eye_on_hand' is not allowed"):
        load_session(folder)


def test_eye_in_hand_session(tmp_path, capsys):
    scene = make_scene("wrist")
    folder = tmp_path / "wrist"
    write_synthetic_session(folder, scene, np.random.default_rng(4), n=8)
    out = tmp_path / "wrist_camera.json"
    assert main(["handeye", "--session", str(folder), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["format"] == "vla-wrist-camera-v1"
    trans_mm, rot_deg = transform_difference(scene.T_cam, np.asarray(data["T_ee_from_cam"]))
    assert trans_mm < 1.5 and rot_deg < 0.1
    with pytest.raises(ValueError, match="field 'format' must be 'vla-camera-v1'"):
        load_camera_file(out)


@pytest.mark.parametrize("args, named", [
    (["handeye", "--session", "no/such/folder", "--out", "c.json"], "--session"),
    (["handeye", "--session", ".", "--out", "c.json", "--method", "tsai"], "--method"),
    (["handeye", "--session", ".", "--out", "c.json", "--max-trans-mm", "0"], "--max-trans-mm"),
    (["handeye", "--session", ".", "--out", "c.json", "--max-rot-deg", "nan"], "--max-rot-deg"),
    (["intrinsics", "--images", ".", "--board", "no_board.json"], "--board"),
    (["handeye", "--session", "."], "--out"),
])
def test_bad_arguments_exit_2_naming_them(args, named, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert named in capsys.readouterr().err


def test_a_folder_without_session_json_is_a_bad_argument(tmp_path, capsys):
    assert main(["handeye", "--session", str(tmp_path), "--out", str(tmp_path / "c.json")]) == 2
    assert "argument --session" in capsys.readouterr().err


def test_intrinsics_command(tmp_path, capsys):
    import cv2

    from calibration.board import BoardSpec
    from calibration.synthetic import BoardRenderer, default_intrinsics, sample_board_pose

    spec, intrinsics, rng = BoardSpec(), default_intrinsics(), np.random.default_rng(0)
    images = tmp_path / "images"
    images.mkdir()
    renderer = BoardRenderer(spec)
    for i in range(8):
        T = sample_board_pose(rng, spec, intrinsics, (0.3, 0.6), max_tilt_deg=45.0)
        cv2.imwrite(str(images / f"{i:02d}.png"), renderer.render(T, intrinsics, rng))
    board = spec.save(tmp_path / "board.json")
    out = tmp_path / "intrinsics.json"
    assert main(["intrinsics", "--images", str(images), "--board", str(board), "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["camera_matrix"][0][0] == pytest.approx(615.0, rel=0.02) and data["rms_px"] < 0.5
    assert main(["intrinsics", "--images", str(images), "--board", str(board), "--max-rms-px", "0.001"]) == 3


def test_selftest_command(capsys):
    assert main(["selftest", "--samples", "8"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_cli_imports_no_opencv_and_help_works():
    code = "import sys, calibration.cli; print('cv2' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
    out = subprocess.run([sys.executable, "-m", "calibration.cli", "--help"], capture_output=True, text=True,
                         check=True).stdout
    assert all(c in out for c in ("board", "intrinsics", "handeye", "selftest"))


@pytest.mark.parametrize("args, named", [
    (["intrinsics", "--images", "{dir}", "--board", "{dir}"], "--board"),
    (["overlay", "--camera-file", "{dir}", "--image", "{dir}", "--out", "o.png"], "--camera-file"),
    (["handeye", "--robot-ip", "127.0.0.1", "--safety-limits", "{dir}", "--out", "c.json"], "--safety-limits"),
])
def test_a_folder_given_for_a_file_is_called_a_folder(args, named, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main([a.format(dir=tmp_path) for a in args])
    assert e.value.code == 2
    assert f"argument {named}: {tmp_path} is a folder, not a file" in capsys.readouterr().err


def test_help_has_the_whole_description_and_its_examples_keep_their_lines(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "solve hand-eye into the camera file,\ncheck it against the real camera (overlay) and watch the camera for " \
           "drift." in out
    assert "--board calib/board/board.json \\\n        --safety-limits cell_limits.yaml" in out
