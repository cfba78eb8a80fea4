"""The session folder: everything one hand-eye solve reads, recorded by hand or by a collector.

Layout::

    SESSION/
      session.json      {"format": "vla-calibration-session-v1",
                         "mode": "eye_to_hand" | "eye_in_hand",
                         "board": {board.json's fields},
                         "intrinsics": {"width": W, "height": H,
                                        "camera_matrix": 3x3, "dist_coeffs": [k1, k2, p1, p2, k3]},
                         "ee_frame": "flange"   (optional: which robot frame the poses are of)}
      images/NNN.png    the camera's image of sample NNN (8-bit gray or BGR, W x H)
      poses/NNN.json    {"T_base_from_ee": 4x4 row-major, metres}   (other keys are kept, unused)

A sample is a pose file and the image of the same stem; a collector writes the image first and
the pose last (atomically), so an interrupted collection leaves only complete samples plus, at
worst, one image without a pose, which the loader reports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.board import BoardSpec
from calibration.errors import BoardNotDetectedError, SessionFormatError, TooFewSamplesError
from calibration.hand_eye import (DEFAULT_MAX_ROT_DEG, DEFAULT_MAX_TRANS_MM, MIN_SAMPLES, HandEyeResult, Mode,
                                  solve_hand_eye)
from calibration.files import write_json_atomic
from calibration.intrinsics import Intrinsics
from calibration.transforms import check_transform

SESSION_FORMAT = "vla-calibration-session-v1"


@dataclass(frozen=True, kw_only=True)
class SessionSpec:
    """What ``session.json`` holds."""

    mode: Mode
    board: BoardSpec
    intrinsics: Intrinsics
    ee_frame: str = "flange"
    """Which robot frame ``T_base_from_ee`` is of (informational; keep one per session)."""

    def to_dict(self) -> dict:
        board = self.board.to_dict()
        board.pop("format")
        return {"format": SESSION_FORMAT, "mode": self.mode.value, "board": board,
                "intrinsics": self.intrinsics.to_dict(), "ee_frame": self.ee_frame}

    @classmethod
    def from_dict(cls, data: dict, source: str) -> SessionSpec:
        """Read ``session.json``'s content; errors name ``source`` and the field."""
        if not isinstance(data, dict):
            raise SessionFormatError(f"{source} must be a JSON object")
        if data.get("format") != SESSION_FORMAT:
            raise SessionFormatError(f"{source}: field 'format' must be {SESSION_FORMAT!r}, got {data.get('format')!r}")
        for name in ("mode", "board", "intrinsics"):
            if name not in data:
                raise SessionFormatError(f"{source} lacks the field {name!r}")
        try:
            mode = Mode.parse(data["mode"])
            board = BoardSpec.from_dict(data["board"], f"{source} field 'board'")
            intrinsics = Intrinsics.from_dict(data["intrinsics"], f"{source} field 'intrinsics'")
        except SessionFormatError:
            raise
        except ValueError as e:
            raise SessionFormatError(f"{source}: {e}" if source not in str(e) else str(e)) from None
        return cls(mode=mode, board=board, intrinsics=intrinsics, ee_frame=str(data.get("ee_frame", "flange")))


@dataclass(frozen=True)
class Sample:
    """One recorded sample."""

    name: str
    """The shared stem of its files, e.g. ``007``."""
    image_path: Path
    T_base_from_ee: np.ndarray


@dataclass(frozen=True)
class Session:
    """A loaded session folder."""

    folder: Path
    spec: SessionSpec
    samples: list[Sample]


def create_session(folder: str | Path, spec: SessionSpec) -> Path:
    """Start a session folder: ``session.json`` plus empty ``images/`` and ``poses/``.

    Raises:
        FileExistsError: if the folder already holds a session (samples of two setups must
            not mix; use a new folder).
    """
    folder = Path(folder)
    if (folder / "session.json").exists():
        raise FileExistsError(f"{folder} already holds a session (session.json); record into a new folder")
    (folder / "images").mkdir(parents=True, exist_ok=True)
    (folder / "poses").mkdir(exist_ok=True)
    write_json_atomic(folder / "session.json", spec.to_dict())
    return folder


def add_sample(folder: str | Path, index: int, image: np.ndarray, T_base_from_ee: np.ndarray,
               extra: dict | None = None) -> str:
    """Record one sample: ``images/NNN.png`` then ``poses/NNN.json``.

    Args:
        folder: a folder made by ``create_session``.
        index: the sample number (0..999 gives three digits; more digits are kept).
        image: the camera image, 8-bit gray or BGR, as it came from the camera.
        T_base_from_ee: the robot pose when the image was taken (4x4, metres).
        extra: more JSON fields for the pose file (e.g. joint positions), unused by the solve.

    Returns:
        The sample's name (``NNN``).
    """
    import cv2

    folder = Path(folder)
    if index < 0:
        raise ValueError(f"sample index must be >= 0, got {index}")
    T = check_transform(T_base_from_ee, "T_base_from_ee")
    name = f"{index:03d}"
    image_path = folder / "images" / f"{name}.png"
    if not cv2.imwrite(str(image_path), np.asarray(image)):
        raise OSError(f"could not write {image_path}")
    write_json_atomic(folder / "poses" / f"{name}.json", {**(extra or {}), "T_base_from_ee": T.tolist()})
    return name


def load_session(folder: str | Path) -> Session:
    """Read and check a session folder (the images are not decoded here).

    Raises:
        FileNotFoundError: if the folder or its ``session.json`` does not exist.
        SessionFormatError: naming the file and field that break the format, a pose without
            its image or an image without its pose.
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"session folder {folder} does not exist")
    meta = folder / "session.json"
    if not meta.is_file():
        raise FileNotFoundError(f"{folder} is not a session folder: it has no session.json")
    try:
        spec = SessionSpec.from_dict(json.loads(meta.read_text()), str(meta))
    except json.JSONDecodeError as e:
        raise SessionFormatError(f"{meta} is not valid JSON: {e}") from None
    pose_dir, image_dir = folder / "poses", folder / "images"
    if not pose_dir.is_dir() or not image_dir.is_dir():
        raise SessionFormatError(f"{folder} needs the folders poses/ and images/")
    poses = {p.stem: p for p in pose_dir.glob("*.json")}
    images = {p.stem: p for p in image_dir.iterdir() if p.suffix.lower() in (".png", ".jpg", ".jpeg", ".bmp")}
    if orphans := sorted(set(poses) - set(images)):
        raise SessionFormatError(f"poses without an image in {image_dir}: {', '.join(orphans)}")
    if orphans := sorted(set(images) - set(poses)):
        raise SessionFormatError(f"images without a pose in {pose_dir}: {', '.join(orphans)} "
                                 "(an interrupted collection? delete them or record their poses)")
    samples = []
    for name in sorted(poses):
        path = poses[name]
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise SessionFormatError(f"{path} is not valid JSON: {e}") from None
        if not isinstance(data, dict) or "T_base_from_ee" not in data:
            raise SessionFormatError(f"{path} lacks the field 'T_base_from_ee' (4x4 row-major, metres)")
        try:
            T = check_transform(data["T_base_from_ee"], f"{path} field 'T_base_from_ee'")
        except ValueError as e:
            raise SessionFormatError(str(e)) from None
        samples.append(Sample(name, images[name], T))
    return Session(folder, spec, samples)


@dataclass(frozen=True)
class SessionResult:
    """A solved session: the hand-eye result and each sample's PnP reprojection error."""

    session: Session
    hand_eye: HandEyeResult
    pnp_rms_px: dict[str, float]
    """Per sample: RMS reprojection error of the board pose, pixels (above ~1 px: blur, a bad
    corner, or intrinsics that do not fit)."""

    def summary(self) -> str:
        worst = max(self.pnp_rms_px, key=self.pnp_rms_px.get)
        return (f"board poses: reprojection RMS median {np.median(list(self.pnp_rms_px.values())):.3f} px, "
                f"worst {worst} {self.pnp_rms_px[worst]:.3f} px\n" + self.hand_eye.summary())


def solve_session(folder: str | Path, *, method: str = "auto", max_trans_mm: float = DEFAULT_MAX_TRANS_MM,
                  max_rot_deg: float = DEFAULT_MAX_ROT_DEG, min_samples: int = MIN_SAMPLES) -> SessionResult:
    """Detect the board in every image of a session, then solve hand-eye (``solve_hand_eye``).

    Translation residuals are measured at the board's centre.

    Raises:
        FileNotFoundError, SessionFormatError: as ``load_session``.
        TooFewSamplesError: fewer than ``min_samples`` samples.
        BoardNotDetectedError: naming the first image without a usable board.
        InsufficientRotationError, CalibrationError: as ``solve_hand_eye``.
    """
    import cv2

    from calibration.detection import board_pose, detect_board

    session = load_session(folder)
    spec = session.spec
    if len(session.samples) < min_samples:
        raise TooFewSamplesError(f"session {session.folder} has {len(session.samples)} samples; hand-eye needs >= "
                                 f"{min_samples} (15-25 recommended)")
    size = (spec.intrinsics.width, spec.intrinsics.height)
    T_cam_from_board, pnp_rms_px = [], {}
    for sample in session.samples:
        image = cv2.imread(str(sample.image_path), cv2.IMREAD_UNCHANGED)
        where = f"images/{sample.image_path.name}"
        if image is None:
            raise BoardNotDetectedError(f"{where} cannot be read as an image", where)
        if (image.shape[1], image.shape[0]) != size:
            raise SessionFormatError(f"{where} is {image.shape[1]}x{image.shape[0]} but the session's intrinsics "
                                     f"are for {size[0]}x{size[1]}")
        obs = detect_board(image, spec.board, where)
        T, rms = board_pose(obs, spec.intrinsics.camera_matrix, spec.intrinsics.dist_coeffs)
        T_cam_from_board.append(T)
        pnp_rms_px[sample.name] = rms
    result = solve_hand_eye([s.T_base_from_ee for s in session.samples], T_cam_from_board, mode=spec.mode,
                            method=method, max_trans_mm=max_trans_mm, max_rot_deg=max_rot_deg,
                            names=[s.name for s in session.samples], board_point=spec.board.center_m,
                            min_samples=min_samples)
    return SessionResult(session, result, pnp_rms_px)
