"""The camera file shared by the calibration tool (which writes it) and the Panda twin (which
reads it): the third-person camera's intrinsics and pose in the robot base frame.

Format (JSON)::

    {"format": "vla-camera-v1", "width": 640, "height": 480,
     "intrinsic": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]],
     "T_base_from_cam": 4x4 row-major, camera axes as in OpenCV (x right, y down, z forward)}
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_CAMERA_FILE = Path(__file__).with_name("default_camera.json")
FORMAT = "vla-camera-v1"
# columns: SAPIEN's camera axes (x forward, y left, z up) expressed in OpenCV's
R_CV_FROM_SAPIEN = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])


@dataclass(frozen=True)
class CameraFile:
    width: int
    height: int
    intrinsic: np.ndarray
    T_base_from_cam: np.ndarray
    path: Path

    def intrinsic_for(self, height: int, width: int) -> np.ndarray:
        """Intrinsics for rendering at another resolution (same field of view)."""
        k = self.intrinsic.copy()
        k[0] *= width / self.width
        k[1] *= height / self.height
        return k

    def sapien_pose_in_base(self):
        """The camera pose in the base frame with SAPIEN's camera axes."""
        import sapien
        from transforms3d.quaternions import mat2quat

        rot = self.T_base_from_cam[:3, :3] @ R_CV_FROM_SAPIEN
        return sapien.Pose(p=self.T_base_from_cam[:3, 3], q=mat2quat(rot))


def load_camera_file(path: str | Path | None = None) -> CameraFile:
    """Read and check a camera file (None: the default shipped with the package)."""
    path = Path(path) if path is not None else DEFAULT_CAMERA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"camera file {path} does not exist")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"camera file {path} is not valid JSON: {e}") from e

    def field(name, check, what):
        if name not in data:
            raise ValueError(f"camera file {path} lacks the field {name!r} ({what})")
        try:
            value = check(data[name])
        except (TypeError, ValueError) as e:
            raise ValueError(f"camera file {path}: field {name!r} must be {what}") from e
        return value

    def positive_int(v):
        if not isinstance(v, int) or v <= 0:
            raise ValueError
        return v

    def matrix(shape):
        def check(v):
            m = np.asarray(v, dtype=float)
            if m.shape != shape or not np.isfinite(m).all():
                raise ValueError
            return m
        return check

    if data.get("format") != FORMAT:
        raise ValueError(f"camera file {path}: field 'format' must be {FORMAT!r}, got {data.get('format')!r}")
    width = field("width", positive_int, "a positive integer (pixels)")
    height = field("height", positive_int, "a positive integer (pixels)")
    k = field("intrinsic", matrix((3, 3)), "a 3x3 matrix [[fx, 0, cx], [0, fy, cy], [0, 0, 1]]")
    t = field("T_base_from_cam", matrix((4, 4)), "a 4x4 homogeneous transform")
    rot = t[:3, :3]
    if not np.allclose(rot @ rot.T, np.eye(3), atol=1e-4) or not np.allclose(t[3], [0, 0, 0, 1]):
        raise ValueError(f"camera file {path}: field 'T_base_from_cam' is not a rigid transform")
    return CameraFile(width, height, k, t, path)
