"""The camera file shared by the calibration tool (which writes it), the Panda twin and the real
Franka env (which read it): the third-person camera's intrinsics and pose in the robot base frame.
``default_camera.json`` beside this module is the reference's camera (PutOnPlateInScene25's).

Format (JSON)::

    {"format": "vla-camera-v1", "width": 640, "height": 480,
     "intrinsic": [[fx, 0, cx], [0, fy, cy], [0, 0, 1]],
     "T_base_from_cam": 4x4 row-major, camera axes as in OpenCV (x right, y down, z forward),
     "calibration": {...}}   (optional: the calibration tool's report, kept as read; its
                             "dist_coeffs" are the real camera's lens distortion, OpenCV's)

Other fields are ignored, so files written before ``calibration`` existed still load. The twin
renders a pinhole camera with ``intrinsic``; a real frame is made one by ``undistorter()``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_CAMERA_FILE = Path(__file__).with_name("default_camera.json")
FORMAT = "vla-camera-v1"
# columns: SAPIEN's camera axes (x forward, y left, z up) expressed in OpenCV's
R_CV_FROM_SAPIEN = np.array([[0.0, -1.0, 0.0], [0.0, 0.0, -1.0], [1.0, 0.0, 0.0]])
UNDISTORT_TOLERANCE_PX = 0.1
"""Distortion that moves no pixel of the frame further than this is left alone (a RealSense's
factory coefficients are often all zero: nothing to do)."""


@dataclass(frozen=True)
class CameraFile:
    width: int
    height: int
    intrinsic: np.ndarray
    T_base_from_cam: np.ndarray
    path: Path
    calibration: dict | None = None
    """How the file was made (date, method, residuals, board), when the calibration tool wrote it."""

    @property
    def dist_coeffs(self) -> np.ndarray | None:
        """The real camera's lens distortion (OpenCV's k1, k2, p1, p2[, k3, ...]) the calibration
        recorded, or None."""
        raw = (self.calibration or {}).get("dist_coeffs")
        return None if raw is None else np.asarray(raw, dtype=float).ravel()

    def undistorter(self) -> Callable[[np.ndarray], np.ndarray] | None:
        """A function that makes a real frame of this camera (``[H, W, 3]`` at the file's
        resolution) the pinhole picture the twin renders: OpenCV's undistortion through
        ``intrinsic`` and ``dist_coeffs``, to the same ``intrinsic`` (bilinear). None when the
        distortion moves no pixel further than ``UNDISTORT_TOLERANCE_PX``: nothing to do.

        Raises:
            ImportError: OpenCV is missing (the ``robot`` extra) and the distortion matters.
        """
        dist = self.dist_coeffs
        if dist is None or not dist.any():
            return None
        try:
            import cv2
        except ImportError as e:
            raise ImportError(f"camera file {self.path} records lens distortion; undistorting real frames needs "
                              "OpenCV: pip install 'vla-rl[robot]'") from e
        k, size = self.intrinsic, (self.width, self.height)
        u, v = np.meshgrid(np.linspace(0, self.width - 1, 33), np.linspace(0, self.height - 1, 25))
        seen = np.stack([u.ravel(), v.ravel()], axis=1)[:, None]  # where the lens puts each sample
        ideal = cv2.undistortPoints(seen, k, dist, P=k)  # where a pinhole camera would
        if np.abs(ideal - seen).max() <= UNDISTORT_TOLERANCE_PX:
            return None
        map1, map2 = cv2.initUndistortRectifyMap(k, dist, None, k, size, cv2.CV_16SC2)
        return lambda frame: cv2.remap(frame, map1, map2, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT)

    def intrinsic_for(self, height: int, width: int, crop: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """Intrinsics of the image the camera sees, or of its region ``crop``, resized to
        ``height`` x ``width``, in OpenCV's convention (pixel centres at integer coordinates), the
        one to project points with. A crop followed by a resize is itself a pinhole camera, so a
        cropped view renders at no extra cost and matches cropping the real camera's frame.

        Args:
            crop: ``(left, top, right, bottom)`` in pixels of this file's resolution (see
                ``check_crop``); None for the whole image.
        """
        k = self.render_intrinsic_for(height, width, crop)
        k[:2, 2] -= 0.5
        return k

    def render_intrinsic_for(self, height: int, width: int, crop: tuple[int, int, int, int] | None = None) -> np.ndarray:
        """``intrinsic_for`` in the renderer's convention, pixel *corners* at integer coordinates:
        the principal point is 0.5 px further right and down. SAPIEN takes this one (given the
        OpenCV one it draws everything 0.5 px up and left), and so does a resampled image whose
        pixel centres sit at half-integers (cropping, and ``resize_rgb`` of a rendered or real
        frame). Crop and resize are exact in it."""
        left, top, right, bottom = self.check_crop(crop)
        k = self.intrinsic.copy()
        k[0, 2] += 0.5 - left
        k[1, 2] += 0.5 - top
        k[0] *= width / (right - left)
        k[1] *= height / (bottom - top)
        return k

    def check_crop(self, crop: tuple[int, int, int, int] | None) -> tuple[int, int, int, int]:
        """``crop`` as four ints (the whole image for None).

        Raises:
            ValueError: naming ``camera_crop`` and the allowed range, if the region is empty or
                leaves the ``width`` x ``height`` image.
        """
        if crop is None:
            return 0, 0, self.width, self.height
        try:
            left, top, right, bottom = (int(v) for v in crop)
        except (TypeError, ValueError):
            raise ValueError(f"camera_crop must be (left, top, right, bottom) in pixels, got {crop!r}") from None
        if not (0 <= left < right <= self.width and 0 <= top < bottom <= self.height):
            raise ValueError(f"camera_crop {tuple(crop)} must satisfy 0 <= left < right <= {self.width} and "
                             f"0 <= top < bottom <= {self.height} (the pixels of camera file {self.path})")
        return left, top, right, bottom

    def crop_fractions(self, crop: tuple[int, int, int, int] | None) -> tuple[float, float, float, float]:
        """The crop as fractions of the image: crops pictures of the same view at any resolution."""
        left, top, right, bottom = self.check_crop(crop)
        return left / self.width, top / self.height, right / self.width, bottom / self.height

    def sapien_pose_in_base(self):
        """The camera pose in the base frame with SAPIEN's camera axes."""
        import sapien
        from transforms3d.quaternions import mat2quat

        rot = self.T_base_from_cam[:3, :3] @ R_CV_FROM_SAPIEN
        return sapien.Pose(p=self.T_base_from_cam[:3, 3], q=mat2quat(rot))


def load_camera_file(path: str | Path | None = None) -> CameraFile:
    """Read and check a camera file (None: the default shipped with the package)."""
    path = Path(path) if path is not None else DEFAULT_CAMERA_FILE
    if path.is_dir():
        raise ValueError(f"camera file {path} is a folder; give the camera file (vla-calibrate handeye writes one)")
    if not path.is_file():
        raise FileNotFoundError(f"camera file {path} does not exist")
    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"camera file {path} is not valid JSON ({e}); a {FORMAT} camera file is") from None
    if not isinstance(data, dict):
        raise ValueError(f"camera file {path} holds a JSON {type(data).__name__}; a {FORMAT} camera file is an object")

    def field(name, check, what):
        if name not in data:
            raise ValueError(f"camera file {path} lacks the field {name!r} ({what})")
        try:
            value = check(data[name])
        except (TypeError, ValueError) as e:
            raise ValueError(f"camera file {path}: field {name!r} must be {what}") from e
        return value

    def positive_int(v):
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
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
    if k[0, 0] <= 0 or k[1, 1] <= 0 or not np.allclose(k[2], [0, 0, 1]):
        raise ValueError(f"camera file {path}: field 'intrinsic' must be [[fx, 0, cx], [0, fy, cy], [0, 0, 1]] with "
                         f"fx, fy > 0, got {k.tolist()}")
    t = field("T_base_from_cam", matrix((4, 4)), "a 4x4 homogeneous transform")
    rot = t[:3, :3]
    if (not np.allclose(rot @ rot.T, np.eye(3), atol=1e-4) or np.linalg.det(rot) < 0
            or not np.allclose(t[3], [0, 0, 0, 1])):
        raise ValueError(f"camera file {path}: field 'T_base_from_cam' is not a rigid transform")
    calibration = data.get("calibration")
    if calibration is not None and not isinstance(calibration, dict):
        raise ValueError(f"camera file {path}: field 'calibration' must be a JSON object (the calibration report), "
                         f"got {type(calibration).__name__}")
    dist = (calibration or {}).get("dist_coeffs")
    if dist is not None:
        try:
            dist = np.asarray(dist, dtype=float).ravel()
        except (TypeError, ValueError):
            dist = np.array([np.nan])
        if dist.size not in (4, 5, 8, 12, 14) or not np.isfinite(dist).all():
            raise ValueError(f"camera file {path}: field 'calibration.dist_coeffs' must hold 4, 5, 8, 12 or 14 finite "
                             f"numbers (OpenCV's k1, k2, p1, p2[, k3, ...]), got {calibration['dist_coeffs']!r}")
    return CameraFile(width, height, k, t, path, calibration)
