"""``vla-calibrate overlay``: the twin rendered from the camera file over a real frame, and the
robot-silhouette offset. The "real" frames are the twin's own render, as is and shifted by known
pixels, so the answer is known; the twin is the real ManiSkill scene on the CPU."""

from __future__ import annotations

import json
import sys

import cv2
import numpy as np
import pytest

from calibration.cli import main
from calibration.intrinsics import Intrinsics
from calibration.overlay import EDGE_BGR, silhouette_offset
from calibration.synthetic import look_at

K = np.array([[610.0, 0.0, 331.4], [0.0, 606.0, 233.2], [0.0, 0.0, 1.0]])
T_BASE_FROM_CAM = look_at([1.50, -0.70, 0.80], [0.25, 0.0, 0.32])
ARM_QPOS = [0.5, 0.1, -0.3, -2.3, 0.1, 2.4, 0.4]


def run_cli(args) -> int:
    """``main``'s exit status, including argparse's own exit for a malformed argument."""
    try:
        return main([str(a) for a in args])
    except SystemExit as e:
        return e.code


def shift(image: np.ndarray, dx: float, dy: float) -> np.ndarray:
    """``image`` moved by (dx, dy) pixels (bilinear, zeros coming in)."""
    M = np.array([[1.0, 0.0, dx], [0.0, 1.0, dy]])
    return cv2.warpAffine(image, M, (image.shape[1], image.shape[0]), flags=cv2.INTER_LINEAR)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A camera file (640 x 480) and plain pictures for the argument checks (no rendering)."""
    from calibration.camera_file import write_camera_file

    root = tmp_path_factory.mktemp("overlay")
    camera = write_camera_file(root / "camera.json", intrinsics=Intrinsics(640, 480, K),
                               T_base_from_cam=T_BASE_FROM_CAM)
    cv2.imwrite(str(root / "gray.png"), np.full((480, 640, 3), 90, np.uint8))
    cv2.imwrite(str(root / "small.png"), np.full((240, 320, 3), 90, np.uint8))
    cv2.imwrite(str(root / "empty_mask.png"), np.zeros((480, 640), np.uint8))
    (root / "not_an_image.png").write_text("no pixels here")
    return {"root": root, "camera": camera}


@pytest.fixture(scope="module")
def twin(files):
    """The twin's render at ``ARM_QPOS`` as a "real" frame and mask on disk."""
    pytest.importorskip("mani_skill", reason="needs the [maniskill] extra: bash scripts/setup.sh maniskill")
    from calibration.overlay import TwinRenderer

    mp = pytest.MonkeyPatch()
    mp.setenv("VLA_ENVS_ASSET_DIR", str(files["root"] / "assets"))  # the CLI's renders find the pack here
    renderer = TwinRenderer(files["camera"])
    view = renderer.render(ARM_QPOS)
    real = files["root"] / "real.png"
    mask = files["root"] / "real_mask.png"
    cv2.imwrite(str(real), view.rgb[..., ::-1])
    cv2.imwrite(str(mask), view.robot_mask.astype(np.uint8) * 255)
    yield {"renderer": renderer, "view": view, "real": real, "mask": mask}
    renderer.close()
    mp.undo()


@pytest.mark.maniskill
def test_overlay_of_the_twin_with_itself_is_exact(files, twin, capsys):
    out = files["root"] / "self" / "overlay.png"
    assert run_cli(["overlay", "--camera-file", files["camera"], "--image", twin["real"], "--out", out,
                    "--qpos", *ARM_QPOS, "--real-mask", twin["mask"]]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["offset_px"] == [0.0, 0.0] and report["iou"] == 1.0
    assert report["size_px"] == [640, 480] and report["twin_robot_pixels"] == int(twin["view"].robot_mask.sum())
    assert report["qpos"][:7] == pytest.approx(ARM_QPOS) and report["mode"] == "edges"
    picture = cv2.imread(str(out))
    assert picture.shape == (480, 640, 3)
    edges = twin["view"].edges
    assert 2000 < edges.sum() < 0.1 * edges.size  # outlines, not areas
    assert (picture[edges] == EDGE_BGR).all()
    np.testing.assert_array_equal(picture[~edges], cv2.imread(str(twin["real"]))[~edges])
    assert "IoU 1.000" in capsys.readouterr().out


@pytest.mark.maniskill
def test_shifted_real_frame_reports_the_shift(files, twin):
    dx, dy = 7.0, -4.0
    real = files["root"] / "shifted.png"
    mask = files["root"] / "shifted_mask.png"
    cv2.imwrite(str(real), shift(cv2.imread(str(twin["real"])), dx, dy))
    cv2.imwrite(str(mask), shift(cv2.imread(str(twin["mask"]), cv2.IMREAD_GRAYSCALE), dx, dy))
    out = files["root"] / "shifted_overlay.png"
    assert run_cli(["overlay", "--camera-file", files["camera"], "--image", real, "--out", out, "--mode", "alpha",
                    "--qpos", *ARM_QPOS, "--real-mask", mask]) == 0
    report = json.loads(out.with_suffix(".json").read_text())
    assert report["offset_px"] == pytest.approx([dx, dy], abs=0.5)
    assert report["offset_norm_px"] == pytest.approx(np.hypot(dx, dy), abs=0.5)
    assert 0.3 < report["iou"] < 0.95
    blended = cv2.imread(str(out)).astype(int)
    expected = (cv2.imread(str(real)).astype(int) + twin["view"].rgb[..., ::-1].astype(int)) / 2
    assert np.abs(blended - expected).max() <= 1


@pytest.mark.maniskill
@pytest.mark.parametrize("dx, dy", [(2.5, 1.25), (-3.0, 0.0), (0.0, -6.5)])
def test_silhouette_offset_follows_subpixel_shifts(twin, dx, dy):
    twin_mask = twin["view"].robot_mask
    moved = shift(twin_mask.astype(np.float32), dx, dy) > 0.5
    offset = silhouette_offset(twin_mask, moved)
    assert (offset.dx_px, offset.dy_px) == pytest.approx((dx, dy), abs=0.5)
    assert offset.iou < 1.0


@pytest.mark.maniskill
def test_joint_positions_outside_the_limits_are_named(twin):
    renderer = twin["renderer"]
    with pytest.raises(ValueError, match=r"joint 4 \(panda_joint4\) is 0.5000, outside its limits"):
        renderer.check_qpos([0.0, 0.0, 0.0, 0.5, 0.0, 2.0, 0.0])
    with pytest.raises(ValueError, match="qpos must be 7 finite joint angles in radians"):
        renderer.check_qpos([0.0] * 6)
    assert renderer.check_qpos(ARM_QPOS)[7:] == pytest.approx(renderer.default_qpos[7:])  # fingers as at rest


@pytest.mark.parametrize("change, named", [
    ({"--qpos": ["0"] * 6}, "--qpos"),
    ({"--camera-crop": ["1,2,3"]}, "--camera-crop"),
    ({"--camera-crop": ["0,0,700,480"]}, "--camera-crop"),
    ({"--image": ["{root}/small.png"]}, "--image"),
    ({"--image": ["{root}/not_an_image.png"]}, "--image"),
    ({"--image": ["{root}/missing.png"]}, "--image"),
    ({"--real-mask": ["{root}/small.png"]}, "--real-mask"),
    ({"--real-mask": ["{root}/empty_mask.png"]}, "--real-mask"),
    ({"--mode": ["outline"]}, "--mode"),
    ({"--out": ["{root}/overlay.jpg"]}, "--out"),
    ({"--camera-file": ["{root}/gray.png"]}, "--camera-file"),
])
def test_bad_arguments_exit_2_naming_the_argument(files, change, named, capsys):
    args = {"--camera-file": ["{camera}"], "--image": ["{root}/gray.png"], "--out": ["{root}/bad/overlay.png"],
            **change}
    argv = ["overlay"] + [str(v).format(**files) for flag, values in args.items() for v in [flag, *values]]
    assert run_cli(argv) == 2
    assert f"argument {named}" in capsys.readouterr().err
    assert not (files["root"] / "bad").exists()


def test_an_out_png_that_is_a_folder_is_called_a_folder(files, capsys):
    folder = files["root"] / "dirpng.png"
    folder.mkdir()
    assert run_cli(["overlay", "--camera-file", files["camera"], "--image", files["root"] / "gray.png",
                    "--out", folder]) == 2
    assert f"argument --out: {folder} is a folder" in capsys.readouterr().err


def test_missing_maniskill_names_the_setup_command(files, monkeypatch, capsys):
    """Without ManiSkill (here: made unimportable) the overlay says how to install it."""
    for name in ("mani_skill", "mani_skill.envs"):
        monkeypatch.setitem(sys.modules, name, None)
    assert run_cli(["overlay", "--camera-file", files["camera"], "--image", files["root"] / "gray.png",
                    "--out", files["root"] / "none.png"]) == 1
    assert "bash scripts/setup.sh maniskill" in capsys.readouterr().err
    assert not (files["root"] / "none.png").exists()
