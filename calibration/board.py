"""The ChArUco board: its spec (``board.json``), the OpenCV board built from it, its image.

A ChArUco board is a chessboard whose white squares hold ArUco markers: each inner chessboard
corner is identified by the markers around it, so a partly hidden or tilted board still gives
corners with known board coordinates. The spec is all a detector needs; print it with
``vla-calibrate board`` (``printout.py``) and measure a printed square before trusting it.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

BOARD_FORMAT = "vla-charuco-board-v1"

# OpenCV's predefined dictionaries: name -> number of markers in it. A board uses
# floor(squares_x * squares_y / 2) markers, ids 0.. in order.
DICTIONARY_SIZES = {
    **{f"DICT_{b}X{b}_{n}": n for b in (4, 5, 6, 7) for n in (50, 100, 250, 1000)},
    "DICT_ARUCO_ORIGINAL": 1024,
    "DICT_APRILTAG_16h5": 30,
    "DICT_APRILTAG_25h9": 35,
    "DICT_APRILTAG_36h10": 2320,
    "DICT_APRILTAG_36h11": 587,
    "DICT_ARUCO_MIP_36h12": 250,
}


@dataclass(frozen=True, kw_only=True)
class BoardSpec:
    """A ChArUco board. The default fits an A4 sheet in landscape (245 x 175 mm) and a
    flange-mounted plate, and its squares stay above ~20 px at 1 m from a 640 x 480 camera."""

    squares_x: int = 7
    """Squares along the board's x axis (its width)."""
    squares_y: int = 5
    """Squares along the board's y axis (its height)."""
    square_length_m: float = 0.035
    """Side of one chessboard square, metres (check the print with a ruler)."""
    marker_length_m: float = 0.026
    """Side of one ArUco marker inside a white square, metres (< square_length_m)."""
    dictionary: str = "DICT_5X5_100"
    """OpenCV predefined ArUco dictionary name (see DICTIONARY_SIZES)."""

    def __post_init__(self):
        for name in ("squares_x", "squares_y"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 3:
                raise ValueError(f"board {name} must be an integer >= 3, got {value!r}")
        for name in ("square_length_m", "marker_length_m"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"board {name} must be a positive number of metres, got {value!r}")
            if value > 1.0:
                raise ValueError(f"board {name} is {value} m: lengths are in metres (a 35 mm square is 0.035), "
                                 "and a board square over 1 m is not plausible")
        if not self.marker_length_m < self.square_length_m:
            raise ValueError(f"board marker_length_m ({self.marker_length_m}) must be smaller than square_length_m "
                             f"({self.square_length_m}): the marker sits inside a white square")
        if self.dictionary not in DICTIONARY_SIZES:
            raise ValueError(f"board dictionary {self.dictionary!r} is not an OpenCV predefined dictionary; "
                             f"allowed: {', '.join(DICTIONARY_SIZES)}")
        if self.num_markers > DICTIONARY_SIZES[self.dictionary]:
            raise ValueError(f"board dictionary {self.dictionary} has {DICTIONARY_SIZES[self.dictionary]} markers but "
                             f"a {self.squares_x}x{self.squares_y} board needs {self.num_markers}; choose a larger one")

    @property
    def num_markers(self) -> int:
        """Markers on the board (one per white square)."""
        return self.squares_x * self.squares_y // 2

    @property
    def width_m(self) -> float:
        """Board width (x), metres."""
        return self.squares_x * self.square_length_m

    @property
    def height_m(self) -> float:
        """Board height (y), metres."""
        return self.squares_y * self.square_length_m

    @property
    def center_m(self) -> np.ndarray:
        """The board's centre in its own frame (metres): where residuals are measured."""
        return np.array([self.width_m / 2.0, self.height_m / 2.0, 0.0])

    def corners_m(self) -> np.ndarray:
        """The inner chessboard corners in the board frame, ``[(sx-1)*(sy-1), 3]`` metres,
        in OpenCV's ChArUco corner-id order (row by row from the top-left)."""
        xs = np.arange(1, self.squares_x) * self.square_length_m
        ys = np.arange(1, self.squares_y) * self.square_length_m
        gx, gy = np.meshgrid(xs, ys)
        return np.stack([gx.ravel(), gy.ravel(), np.zeros(gx.size)], axis=1)

    def describe(self) -> str:
        """One line for labels and logs."""
        return (f"ChArUco {self.squares_x}x{self.squares_y}, square {self.square_length_m * 1000:g} mm, "
                f"marker {self.marker_length_m * 1000:g} mm, {self.dictionary}")

    # ------------------------------------------------------------------ board.json
    def to_dict(self) -> dict:
        """The ``board.json`` content."""
        return {"format": BOARD_FORMAT, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict, source: str = "board spec") -> BoardSpec:
        """Read a spec; ``source`` names it in errors.

        Raises:
            ValueError: naming the missing or invalid field.
        """
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be a JSON object, got {type(data).__name__}")
        if data.get("format", BOARD_FORMAT) != BOARD_FORMAT:
            raise ValueError(f"{source}: field 'format' must be {BOARD_FORMAT!r}, got {data.get('format')!r}")
        fields = ("squares_x", "squares_y", "square_length_m", "marker_length_m", "dictionary")
        missing = [f for f in fields if f not in data]
        if missing:
            raise ValueError(f"{source} lacks the field(s) {', '.join(map(repr, missing))}")
        try:
            return cls(**{f: data[f] for f in fields})
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from None

    def save(self, path: str | Path) -> Path:
        """Write ``board.json``."""
        from calibration.files import write_json_atomic

        return write_json_atomic(path, self.to_dict())

    @classmethod
    def load(cls, path: str | Path) -> BoardSpec:
        """Read ``board.json``.

        Raises:
            FileNotFoundError: if it does not exist.
            ValueError: if it is not JSON or a field is missing or invalid (named).
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"board file {path} does not exist (write one with `vla-calibrate board`)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"board file {path} is not valid JSON: {e}") from None
        return cls.from_dict(data, f"board file {path}")


@lru_cache(maxsize=8)
def cv_board(spec: BoardSpec):
    """The ``cv2.aruco.CharucoBoard`` of a spec (cached per spec)."""
    import cv2

    dictionary = cv2.aruco.getPredefinedDictionary(getattr(cv2.aruco, spec.dictionary))
    return cv2.aruco.CharucoBoard((spec.squares_x, spec.squares_y), spec.square_length_m,
                                  spec.marker_length_m, dictionary)


def board_image(spec: BoardSpec, px_per_square: int) -> np.ndarray:
    """The board alone as a grayscale image (uint8, 0 black / 255 white), no margin.

    ``px_per_square`` is an integer so every square edge falls on a pixel edge: pixel ``(u, v)``
    covers board coordinates ``[u, u+1) * square_length_m / px_per_square`` (and so for v).
    """
    if px_per_square < 8:
        raise ValueError(f"px_per_square must be >= 8 to draw the markers' bits, got {px_per_square}")
    size = (spec.squares_x * px_per_square, spec.squares_y * px_per_square)
    return cv_board(spec).generateImage(size, marginSize=0, borderBits=1)
