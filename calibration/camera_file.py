"""Writing the camera file the Panda twin reads (``vla-camera-v1``), with the calibration report.

The format's reader is ``vla_envs.camera_file.load_camera_file``: it needs
``format``, ``width``, ``height``, ``intrinsic`` and ``T_base_from_cam`` and ignores other
fields. This writer adds a ``calibration`` object: when, how, how well. The file is written to a
temporary name beside the target, read back with that reader, then renamed over the target, so
a crash or a bad value never leaves a half-written or unreadable camera file in place.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from calibration.hand_eye import Mode
from calibration.intrinsics import Intrinsics
from calibration.files import write_json_atomic
from calibration.transforms import check_transform

CAMERA_FORMAT = "vla-camera-v1"  # the same string as the twin's reader checks
WRIST_CAMERA_FORMAT = "vla-wrist-camera-v1"


def calibration_block(result, *, accepted: bool = False) -> dict:
    """The ``calibration`` object of a solved session (a ``session.SessionResult``).

    Args:
        result: the solved session.
        accepted: the residuals failed the thresholds and the file was written anyway.
    """
    spec = result.session.spec
    hand_eye = result.hand_eye
    board = spec.board.to_dict()
    board.pop("format")
    block = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"), "tool": "vla-calibrate handeye",
             "session": result.session.folder.name, **hand_eye.report(), "accepted_despite_failure": accepted,
             "board": board, "image_size": [spec.intrinsics.width, spec.intrinsics.height],
             "dist_coeffs": spec.intrinsics.dist_coeffs.tolist(), "ee_frame": spec.ee_frame,
             "pnp_rms_px_median": round(float(np.median(list(result.pnp_rms_px.values()))), 4)}
    T_board = hand_eye.solution.T_board
    key = "T_ee_from_board" if hand_eye.mode is Mode.EYE_TO_HAND else "T_base_from_board"
    block[key] = np.round(T_board, 6).tolist()
    return block


def write_camera_file(path: str | Path, *, intrinsics: Intrinsics, T_base_from_cam: np.ndarray,
                      calibration: dict | None = None) -> Path:
    """Write a ``vla-camera-v1`` file atomically, checked by the twin's own reader.

    Args:
        path: the camera file (``gym.make(..., camera_file=path)``).
        intrinsics: the camera's K and image size (distortion goes into ``calibration``: the
            twin renders a pinhole camera).
        T_base_from_cam: the camera's pose in the robot base frame, OpenCV camera axes.
        calibration: the report to store with it (``calibration_block``).

    Returns:
        The path written.

    Raises:
        ValueError: if the reader rejects the content (the target is left untouched).
    """
    from vla_envs.camera_file import load_camera_file

    T = check_transform(T_base_from_cam, "T_base_from_cam")
    data = {"format": CAMERA_FORMAT, "width": intrinsics.width, "height": intrinsics.height,
            "intrinsic": intrinsics.camera_matrix.tolist(), "T_base_from_cam": T.tolist()}
    if calibration is not None:
        data["calibration"] = calibration
    return write_json_atomic(Path(path), data, load_camera_file)


def write_wrist_camera_file(path: str | Path, *, intrinsics: Intrinsics, T_ee_from_cam: np.ndarray,
                            calibration: dict | None = None) -> Path:
    """Write an eye-in-hand result: like the camera file, with ``T_ee_from_cam`` (the camera's
    pose in the ee frame) in place of ``T_base_from_cam`` and the format ``vla-wrist-camera-v1``.
    The twin has no wrist camera; its reader rejects this format by name."""
    T = check_transform(T_ee_from_cam, "T_ee_from_cam")
    data = {"format": WRIST_CAMERA_FORMAT, "width": intrinsics.width, "height": intrinsics.height,
            "intrinsic": intrinsics.camera_matrix.tolist(), "T_ee_from_cam": T.tolist()}
    if calibration is not None:
        data["calibration"] = calibration
    return write_json_atomic(Path(path), data, lambda p: json.loads(p.read_text()))
