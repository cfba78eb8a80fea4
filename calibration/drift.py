"""Drift: has the camera moved since the camera file was made?

A camera file is only right while the camera stays where it was calibrated; a bumped tripod
or a loosened clamp silently moves every real frame away from what the twin renders. Drift is
measured against a ChArUco board fixed in the scene (on the table, off the robot's path; not on
the robot):

* ``pin_reference`` (``vla-calibrate drift pin``), right after calibrating: detects the board in
  one frame and stores the frame, the board spec, its corners, the board's pose in the camera
  (``T_cam_from_board``) and the camera file's SHA-256 in a reference folder.
* ``check_drift`` (``vla-calibrate drift check``, and the robot eval tool before its episodes):
  detects the board in a new frame and reports how far its corners moved in the image (mean and
  max, pixels) and how the camera moved (``T_camref_from_camnow = T_cam_from_board_ref @
  inv(T_cam_from_board_now)``: the new camera pose in the reference camera's frame; its
  translation in mm, its rotation angle in degrees). The board is assumed fixed, so any change
  is read as camera motion; a board that moved reads the same and needs a new reference.

Reference folder::

    REF/
      reference.json  {"format": "vla-drift-reference-v1", "date", "image": "reference.png",
                       "camera_file": name, "camera_file_sha256": hex, "width", "height",
                       "camera_matrix": 3x3, "dist_coeffs": [...], "board": {board.json's fields},
                       "corner_ids": [N], "corners_px": [N, 2], "T_cam_from_board": 4x4,
                       "pnp_rms_px": float}
      reference.png   the frame the board was detected in
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from calibration.board import BoardSpec
from calibration.errors import BoardNotDetectedError, CalibrationError
from calibration.files import write_bytes_atomic, write_json_atomic
from calibration.intrinsics import intrinsics_from_matrix
from calibration.transforms import check_transform, invert, rotation_angle_deg

REFERENCE_FORMAT = "vla-drift-reference-v1"
REFERENCE_JSON = "reference.json"
REFERENCE_IMAGE = "reference.png"
DEFAULT_MAX_PX = 2.0
DEFAULT_MAX_MM = 3.0
DEFAULT_MAX_DEG = 0.3
MIN_COMMON_CORNERS = 6


class DriftReferenceError(CalibrationError):
    """A drift reference folder is missing or does not follow the documented format."""


@dataclass(frozen=True, eq=False)
class DriftReference:
    """What ``pin_reference`` stored (see the module doc)."""

    folder: Path
    camera_file: str
    """The camera file's name when pinned (informational)."""
    camera_file_sha256: str
    width: int
    height: int
    camera_matrix: np.ndarray
    dist_coeffs: np.ndarray
    board: BoardSpec
    corner_ids: np.ndarray
    """``[N]`` ChArUco corner ids found in the reference frame."""
    corners_px: np.ndarray
    """``[N, 2]`` their positions, pixels (centres at integers)."""
    T_cam_from_board: np.ndarray
    pnp_rms_px: float
    date: str

    def to_dict(self) -> dict:
        board = self.board.to_dict()
        board.pop("format")
        return {"format": REFERENCE_FORMAT, "date": self.date, "image": REFERENCE_IMAGE,
                "camera_file": self.camera_file, "camera_file_sha256": self.camera_file_sha256,
                "width": self.width, "height": self.height, "camera_matrix": self.camera_matrix.tolist(),
                "dist_coeffs": self.dist_coeffs.tolist(), "board": board,
                "corner_ids": self.corner_ids.tolist(), "corners_px": np.round(self.corners_px, 4).tolist(),
                "T_cam_from_board": np.round(self.T_cam_from_board, 8).tolist(),
                "pnp_rms_px": round(self.pnp_rms_px, 4)}

    @classmethod
    def load(cls, folder: str | Path) -> DriftReference:
        """Read a reference folder.

        Raises:
            DriftReferenceError: naming the folder and the missing or invalid field.
        """
        folder = Path(folder)
        path = folder / REFERENCE_JSON
        if not path.is_file():
            raise DriftReferenceError(f"{folder} is not a drift reference: {REFERENCE_JSON} is missing "
                                      "(make one with `vla-calibrate drift pin`)")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise DriftReferenceError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(data, dict) or data.get("format") != REFERENCE_FORMAT:
            got = data.get("format") if isinstance(data, dict) else type(data).__name__
            raise DriftReferenceError(f"{path}: field 'format' must be {REFERENCE_FORMAT!r}, got {got!r}")
        fields = ("camera_file_sha256", "width", "height", "camera_matrix", "board", "corner_ids", "corners_px",
                  "T_cam_from_board")
        missing = [f for f in fields if f not in data]
        if missing:
            raise DriftReferenceError(f"{path} lacks the field(s) {', '.join(map(repr, missing))}")
        try:
            ids = np.asarray(data["corner_ids"], dtype=int).reshape(-1)
            corners = np.asarray(data["corners_px"], dtype=float).reshape(len(ids), 2)
            if not np.isfinite(corners).all():
                raise ValueError("field 'corners_px' must hold finite pixel coordinates")
            width, height = int(data["width"]), int(data["height"])
            intrinsics = intrinsics_from_matrix(data["camera_matrix"], data.get("dist_coeffs"), width=width,
                                                height=height, source=str(path))
            K, dist = intrinsics.camera_matrix, intrinsics.dist_coeffs
            board = BoardSpec.from_dict(data["board"], f"{path} field 'board'")
            T = check_transform(data["T_cam_from_board"], f"{path} field 'T_cam_from_board'")
        except (TypeError, ValueError) as e:
            raise DriftReferenceError(f"{path}: {e}") from None
        return cls(folder=folder, camera_file=str(data.get("camera_file", "")),
                   camera_file_sha256=str(data["camera_file_sha256"]), width=width, height=height,
                   camera_matrix=K, dist_coeffs=dist, board=board, corner_ids=ids, corners_px=corners,
                   T_cam_from_board=T, pnp_rms_px=float(data.get("pnp_rms_px", float("nan"))),
                   date=str(data.get("date", "")))


def _read(image, what: str) -> tuple[np.ndarray, str]:
    """``(pixels, name)`` of an image given as a path or an array (8-bit gray or BGR)."""
    if isinstance(image, (str, Path)):
        from calibration.overlay import read_image

        return read_image(image, what), Path(image).name
    return np.asarray(image), what


def _observe(image: np.ndarray, name: str, board: BoardSpec, width: int, height: int, camera_matrix: np.ndarray,
             dist_coeffs: np.ndarray):
    from calibration.detection import board_pose, detect_board

    h, w = image.shape[:2]
    if (w, h) != (width, height):
        raise CalibrationError(f"image {name} is {w}x{h}; the camera file and the drift reference are for "
                               f"{width}x{height} frames (use the stream the camera file was calibrated for)")
    observation = detect_board(image, board, name)
    T_cam_from_board, rms_px = board_pose(observation, camera_matrix, dist_coeffs)
    return observation, T_cam_from_board, rms_px


def pin_reference(out: str | Path, camera_file: str | Path, image, board: BoardSpec) -> DriftReference:
    """Detect the fixed board in a frame and store the drift reference in ``out``.

    Args:
        out: the reference folder (created; an earlier reference there is replaced).
        camera_file: the camera file in use (``vla-camera-v1``); its K (and the distortion in its
            calibration report, if any) give the board's pose, its SHA-256 ties the reference to it.
        image: the frame, a path or an 8-bit gray/BGR array at the camera file's resolution.
        board: the spec of the fixed board.

    Returns:
        The stored reference.

    Raises:
        BoardNotDetectedError: the board is not in the frame (named).
        CalibrationError: the frame's size is not the camera file's.
    """
    import cv2

    from calibration.overlay import file_sha256
    from vla_envs.camera_file import load_camera_file

    camera = load_camera_file(camera_file)
    dist = np.asarray((camera.calibration or {}).get("dist_coeffs", np.zeros(5)), dtype=float).reshape(-1)
    pixels, name = _read(image, "image")
    observation, T_cam_from_board, rms_px = _observe(pixels, name, board, camera.width, camera.height,
                                                     camera.intrinsic, dist)
    out = Path(out)
    reference = DriftReference(
        folder=out, camera_file=camera.path.name, camera_file_sha256=file_sha256(camera.path), width=camera.width,
        height=camera.height, camera_matrix=camera.intrinsic, dist_coeffs=dist, board=board,
        corner_ids=observation.ids, corners_px=observation.image_points, T_cam_from_board=T_cam_from_board,
        pnp_rms_px=rms_px, date=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    out.mkdir(parents=True, exist_ok=True)
    encoded, png = cv2.imencode(".png", pixels)
    if not encoded:
        raise CalibrationError(f"could not encode {out / REFERENCE_IMAGE}")
    write_bytes_atomic(out / REFERENCE_IMAGE, png.tobytes())
    # the JSON last and atomically: a folder with a reference.json is always complete
    write_json_atomic(out / REFERENCE_JSON, reference.to_dict())
    return reference


@dataclass(frozen=True, eq=False)
class DriftReport:
    """How far the camera moved since the reference was pinned, and whether that is acceptable."""

    reference: str
    image: str
    corners: int
    """Corners found in both the reference and the new frame (compared)."""
    mean_px: float
    """Mean displacement of those corners in the image, pixels (what ``max_px`` limits)."""
    max_px: float
    """Largest displacement of one corner, pixels."""
    camera_moved_mm: float
    """Translation of ``T_camref_from_camnow``, mm."""
    camera_rotated_deg: float
    """Rotation angle of ``T_camref_from_camnow``, degrees."""
    T_camref_from_camnow: np.ndarray
    """The new camera pose in the reference camera's frame (OpenCV axes, metres)."""
    limit_px: float
    limit_mm: float
    limit_deg: float
    camera_file_problem: str | None = None
    """Set when the camera file given differs from the one the reference was pinned with."""

    @property
    def problems(self) -> list[str]:
        """Each reason the check fails, in words (empty: passed)."""
        out = []
        if self.camera_file_problem:
            out.append(self.camera_file_problem)
        # written "not <=": a value that is not a number (NaN) fails, as no measurement passed
        if not self.mean_px <= self.limit_px:
            out.append(f"the board's corners moved {self.mean_px:.2f} px on average (limit {self.limit_px:g} px)")
        if not self.camera_moved_mm <= self.limit_mm:
            out.append(f"the camera moved {self.camera_moved_mm:.2f} mm (limit {self.limit_mm:g} mm)")
        if not self.camera_rotated_deg <= self.limit_deg:
            out.append(f"the camera turned {self.camera_rotated_deg:.3f} deg (limit {self.limit_deg:g} deg)")
        return out

    @property
    def passed(self) -> bool:
        """Every limit holds (and the camera file, if given, is the pinned one)."""
        return not self.problems

    def __str__(self) -> str:
        return self.summary()

    def summary(self) -> str:
        lines = [f"drift of {self.image} against {self.reference}: {self.corners} corners moved {self.mean_px:.2f} px "
                 f"mean, {self.max_px:.2f} px max; camera moved {self.camera_moved_mm:.2f} mm and turned "
                 f"{self.camera_rotated_deg:.3f} deg (limits {self.limit_px:g} px, {self.limit_mm:g} mm, "
                 f"{self.limit_deg:g} deg)"]
        lines += [f"  - {p}" for p in self.problems]
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return {"reference": self.reference, "image": self.image, "corners": self.corners,
                "mean_px": round(self.mean_px, 4), "max_px": round(self.max_px, 4),
                "camera_moved_mm": round(self.camera_moved_mm, 4),
                "camera_rotated_deg": round(self.camera_rotated_deg, 5),
                "T_camref_from_camnow": np.round(self.T_camref_from_camnow, 8).tolist(),
                "limits": {"px": self.limit_px, "mm": self.limit_mm, "deg": self.limit_deg},
                "camera_file_problem": self.camera_file_problem, "passed": self.passed, "problems": self.problems}


def check_drift(reference_dir: str | Path, image, *, camera_file: str | Path | None = None,
                max_px: float = DEFAULT_MAX_PX, max_mm: float = DEFAULT_MAX_MM,
                max_deg: float = DEFAULT_MAX_DEG) -> DriftReport:
    """Measure how far the camera moved since ``reference_dir`` was pinned.

    Args:
        reference_dir: a folder written by ``pin_reference``.
        image: the current frame: a path, or an 8-bit gray, BGR or RGB array at the reference's
            resolution (the board is black and white, so the channel order does not matter).
        camera_file: the camera file in use now; if given and not the one the reference was pinned
            with (SHA-256), the report fails and names both.
        max_px: limit on the mean corner displacement, pixels.
        max_mm: limit on the camera's translation, mm.
        max_deg: limit on the camera's rotation, degrees.

    Returns:
        The report; ``report.passed`` says whether every limit holds, ``report.problems`` why not.

    Raises:
        DriftReferenceError: the reference folder is missing or malformed.
        BoardNotDetectedError: the board is not found in ``image`` (moved, covered or removed).
        CalibrationError: the frame's size differs from the reference's, or too few corners are
            common to both frames.

    Example:
        >>> report = check_drift("calib/drift_ref", frame_bgr, camera_file="calib/camera.json")  # doctest: +SKIP
        >>> if not report.passed:  # doctest: +SKIP
        ...     raise SystemExit(report.summary())
    """
    for name, value in (("max_px", max_px), ("max_mm", max_mm), ("max_deg", max_deg)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
            raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
    reference = DriftReference.load(reference_dir)
    pixels, name = _read(image, "image")
    try:
        observation, T_now, _ = _observe(pixels, name, reference.board, reference.width, reference.height,
                                         reference.camera_matrix, reference.dist_coeffs)
    except BoardNotDetectedError as e:
        raise BoardNotDetectedError(f"drift check: {e} The drift board ({reference.board.describe()}) must stay "
                                    f"where it was when {reference.folder} was pinned.", e.image) from None
    common, ref_index, now_index = np.intersect1d(reference.corner_ids, observation.ids, return_indices=True)
    if len(common) < MIN_COMMON_CORNERS:
        raise CalibrationError(f"drift check: only {len(common)} of the board's corners are found in both {name} and "
                               f"the reference {reference.folder} (need >= {MIN_COMMON_CORNERS}); is the board "
                               "partly covered?")
    displacement_px = np.linalg.norm(observation.image_points[now_index] - reference.corners_px[ref_index], axis=1)
    T_camref_from_camnow = reference.T_cam_from_board @ invert(T_now)
    problem = None
    if camera_file is not None:
        from calibration.overlay import file_sha256

        sha = file_sha256(camera_file)
        if sha != reference.camera_file_sha256:
            problem = (f"camera file mismatch: {reference.folder} was pinned with camera file "
                       f"{reference.camera_file or '?'} (sha256 {reference.camera_file_sha256[:12]}), "
                       f"but {camera_file} has sha256 {sha[:12]}: it was re-calibrated or edited since; check the "
                       "overlay, then pin a new reference (vla-calibrate drift pin)")
    return DriftReport(reference=str(reference.folder), image=name, corners=len(common),
                       mean_px=float(displacement_px.mean()), max_px=float(displacement_px.max()),
                       camera_moved_mm=float(np.linalg.norm(T_camref_from_camnow[:3, 3]) * 1000.0),
                       camera_rotated_deg=rotation_angle_deg(T_camref_from_camnow[:3, :3]),
                       T_camref_from_camnow=T_camref_from_camnow, limit_px=float(max_px), limit_mm=float(max_mm),
                       limit_deg=float(max_deg), camera_file_problem=problem)
