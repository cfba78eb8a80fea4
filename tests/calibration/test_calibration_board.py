"""The board spec, its JSON, and the printout at true scale."""

from __future__ import annotations

import json
import re
import zlib

import numpy as np
import pytest

from calibration.board import BOARD_FORMAT, BoardSpec, cv_board
from calibration.cli import main
from calibration.printout import choose_page

PT_PER_MM = 72 / 25.4


@pytest.mark.parametrize("kwargs, field", [
    ({"squares_x": 2}, "squares_x"),
    ({"squares_y": 4.0}, "squares_y"),
    ({"square_length_m": 35.0}, "square_length_m"),  # millimetres given as metres
    ({"marker_length_m": -0.01}, "marker_length_m"),
    ({"marker_length_m": 0.035}, "marker_length_m"),  # not smaller than the square
    ({"dictionary": "DICT_5X5_99"}, "dictionary"),
    ({"squares_x": 12, "squares_y": 10, "dictionary": "DICT_4X4_50"}, "dictionary .* needs 60"),
])
def test_invalid_spec_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        BoardSpec(**kwargs)


def test_board_json_round_trip_and_errors(tmp_path):
    spec = BoardSpec(squares_x=6, squares_y=4, square_length_m=0.04, marker_length_m=0.03, dictionary="DICT_4X4_50")
    path = spec.save(tmp_path / "board.json")
    assert json.loads(path.read_text())["format"] == BOARD_FORMAT
    assert BoardSpec.load(path) == spec
    data = spec.to_dict()
    del data["dictionary"]
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="'dictionary'"):
        BoardSpec.load(path)
    path.write_text(json.dumps({**spec.to_dict(), "squares_x": "six"}))
    with pytest.raises(ValueError, match="squares_x"):
        BoardSpec.load(path)
    with pytest.raises(FileNotFoundError, match="vla-calibrate board"):
        BoardSpec.load(tmp_path / "missing.json")


def test_corner_coordinates_match_opencv():
    spec = BoardSpec()
    np.testing.assert_allclose(spec.corners_m(), cv_board(spec).getChessboardCorners(), atol=1e-7)


def test_page_choice():
    assert choose_page(BoardSpec())[0] == "A4 landscape"  # 245 x 175 mm
    assert choose_page(BoardSpec(squares_x=9, squares_y=6, square_length_m=0.04, marker_length_m=0.03)) == \
        ("A3 landscape", 420.0, 297.0)  # 360 x 240 mm
    name, w, h = choose_page(BoardSpec(squares_x=14, squares_y=10, square_length_m=0.05, marker_length_m=0.04))
    assert name == "custom" and w >= 700 and h >= 500


def test_board_command_writes_true_scale_pdf_png_and_json(tmp_path):
    import cv2
    from PIL import Image

    assert main(["board", "--out", str(tmp_path), "--dpi", "150"]) == 0
    spec = BoardSpec.load(tmp_path / "board.json")
    assert spec == BoardSpec()

    # PDF: an A4 landscape page, the board image drawn at exactly 245 x 175 mm
    pdf = (tmp_path / "board.pdf").read_bytes()
    (box,) = re.findall(rb"/MediaBox \[ *0 0 ([\d.]+) ([\d.]+) *\]", pdf)
    assert float(box[0]) == pytest.approx(297 * PT_PER_MM, abs=0.01)
    assert float(box[1]) == pytest.approx(210 * PT_PER_MM, abs=0.01)
    placements = []
    for stream in re.findall(rb"stream\r?\n(.*?)\r?\nendstream", pdf, re.S):
        try:
            content = zlib.decompress(stream)
        except zlib.error:
            continue
        placements += re.findall(rb"([\d.]+) 0 0 -?([\d.]+)\s+0 -?[\d.]+ cm /I\d+ Do", content)
    assert len(placements) == 1
    width_pt, height_pt = (float(v) for v in placements[0])
    assert width_pt == pytest.approx(spec.width_m * 1000 * PT_PER_MM, abs=0.01)
    assert height_pt == pytest.approx(spec.height_m * 1000 * PT_PER_MM, abs=0.01)

    # PNG: its DPI header makes a square exactly 35 mm, and OpenCV finds every corner in it
    png = Image.open(tmp_path / "board.png")
    dpi = png.info["dpi"][0]
    image = np.asarray(png.convert("L"))
    corners, ids, _, _ = cv2.aruco.CharucoDetector(cv_board(spec)).detectBoard(image)
    assert len(ids) == (spec.squares_x - 1) * (spec.squares_y - 1)
    order = np.argsort(ids.ravel())
    pts = corners.reshape(-1, 2)[order]
    spacing_px = np.median(np.diff(pts[: spec.squares_x - 1, 0]))
    assert spacing_px / dpi * 25.4 == pytest.approx(spec.square_length_m * 1000, rel=2e-3)


def test_board_command_bad_argument_exits_2(tmp_path, capsys):
    assert main(["board", "--out", str(tmp_path), "--marker-length-mm", "40"]) == 2
    assert "--marker-length-mm" in capsys.readouterr().err
    assert not (tmp_path / "board.pdf").exists()
    with pytest.raises(SystemExit) as e:
        main(["board", "--out", str(tmp_path), "--square-length-mm", "-3"])
    assert e.value.code == 2
    assert "--square-length-mm" in capsys.readouterr().err


def test_board_command_refuses_a_file_as_its_out_folder(tmp_path, capsys):
    taken = tmp_path / "board"
    taken.write_text("kept")
    assert main(["board", "--out", str(taken)]) == 2
    assert f"argument --out: {taken} is a file; give the folder" in capsys.readouterr().err
    assert taken.read_text() == "kept"
