"""Camera intrinsics: the camera matrix K and distortion, from ChArUco images or given.

A RealSense reports factory intrinsics per stream and resolution; ``intrinsics_from_matrix``
takes those as they are. ``calibrate_intrinsics`` estimates them from ~15-30 views of the
board: OpenCV's ``calibrateCamera`` on the ChArUco corners, then images whose reprojection
error is far above the median (motion blur, a misdetected corner) are dropped and the solve
repeated, so one bad frame cannot bend K.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calibration.board import BoardSpec
from calibration.errors import BoardNotDetectedError, TooFewSamplesError
from calibration.files import write_json_atomic

INTRINSICS_FORMAT = "vla-intrinsics-v1"
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".tif", ".tiff")


@dataclass(frozen=True, eq=False)
class Intrinsics:
    """A pinhole camera with OpenCV distortion, for images of ``width`` x ``height``."""

    width: int
    height: int
    camera_matrix: np.ndarray
    """K, 3x3: [[fx, 0, cx], [0, fy, cy], [0, 0, 1]], pixels."""
    dist_coeffs: np.ndarray = field(default_factory=lambda: np.zeros(5))
    """OpenCV distortion (k1, k2, p1, p2[, k3, ...]); zeros for an undistorted stream."""

    def to_dict(self) -> dict:
        """JSON-ready: ``width``, ``height``, ``camera_matrix``, ``dist_coeffs``."""
        return {"width": self.width, "height": self.height, "camera_matrix": self.camera_matrix.tolist(),
                "dist_coeffs": self.dist_coeffs.tolist()}

    @classmethod
    def from_dict(cls, data: dict, source: str = "intrinsics") -> Intrinsics:
        """Read what ``to_dict`` wrote; errors name ``source`` and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{source} must be a JSON object with width, height, camera_matrix, dist_coeffs")
        for name in ("width", "height", "camera_matrix"):
            if name not in data:
                raise ValueError(f"{source} lacks the field {name!r}")
        return intrinsics_from_matrix(data["camera_matrix"], data.get("dist_coeffs"), width=data["width"],
                                      height=data["height"], source=source)


def intrinsics_from_matrix(camera_matrix, dist_coeffs=None, *, width: int, height: int,
                           source: str = "intrinsics") -> Intrinsics:
    """Intrinsics given explicitly (e.g. a RealSense's factory calibration of the stream used).

    Args:
        camera_matrix: 3x3 K in pixels of a ``width`` x ``height`` image.
        dist_coeffs: 4, 5, 8, 12 or 14 OpenCV coefficients; None for no distortion.
        width, height: image size in pixels.
        source: how errors name the input.

    Raises:
        ValueError: naming the field that is malformed.
    """
    for name, value in (("width", width), ("height", height)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
            raise ValueError(f"{source}: field {name!r} must be a positive integer (pixels), got {value!r}")
    try:
        K = np.asarray(camera_matrix, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: field 'camera_matrix' must be a 3x3 matrix of numbers") from None
    if K.shape != (3, 3) or not np.isfinite(K).all():
        raise ValueError(f"{source}: field 'camera_matrix' must be a finite 3x3 matrix, got shape {K.shape}")
    if K[0, 0] <= 0 or K[1, 1] <= 0 or not np.allclose(K[2], [0, 0, 1]) or K[1, 0] != 0:
        raise ValueError(f"{source}: field 'camera_matrix' must be [[fx, s, cx], [0, fy, cy], [0, 0, 1]] with "
                         f"fx, fy > 0, got {K.tolist()}")
    dist = np.zeros(5) if dist_coeffs is None else np.asarray(dist_coeffs, dtype=float).ravel()
    if dist.size not in (4, 5, 8, 12, 14) or not np.isfinite(dist).all():
        raise ValueError(f"{source}: field 'dist_coeffs' must hold 4, 5, 8, 12 or 14 finite numbers "
                         f"(OpenCV's k1, k2, p1, p2[, k3, ...]), got {dist.size}")
    return Intrinsics(int(width), int(height), K, dist)


@dataclass(frozen=True)
class IntrinsicsResult:
    """The outcome of ``calibrate_intrinsics``."""

    intrinsics: Intrinsics
    rms_px: float
    """RMS reprojection error over the corners of the kept images, pixels."""
    per_image_rms_px: dict[str, float]
    """Each kept image's RMS reprojection error, pixels."""
    rejected: dict[str, float]
    """Images dropped as outliers, with their error in the solve that dropped them."""
    undetected: dict[str, str]
    """Images without a usable board, with the reason."""

    def to_dict(self) -> dict:
        """The ``intrinsics.json`` content."""
        return {"format": INTRINSICS_FORMAT, **self.intrinsics.to_dict(), "rms_px": self.rms_px,
                "per_image_rms_px": self.per_image_rms_px, "rejected": self.rejected, "undetected": self.undetected}

    def summary(self) -> str:
        """A few lines for the CLI."""
        K = self.intrinsics.camera_matrix
        lines = [f"{len(self.per_image_rms_px)} images used, RMS reprojection error {self.rms_px:.3f} px",
                 f"fx {K[0, 0]:.2f}  fy {K[1, 1]:.2f}  cx {K[0, 2]:.2f}  cy {K[1, 2]:.2f}  "
                 f"dist {np.array2string(self.intrinsics.dist_coeffs, precision=4)}"]
        lines += [f"rejected {n} (error {e:.3f} px)" for n, e in self.rejected.items()]
        lines += [f"skipped {n}: {why}" for n, why in self.undetected.items()]
        return "\n".join(lines)


def load_images(folder: str | Path) -> list[tuple[str, np.ndarray]]:
    """The images of a folder, sorted by name, as ``(file name, BGR image)``.

    Raises:
        FileNotFoundError: if the folder does not exist or holds no image.
        ValueError: naming a file OpenCV cannot decode.
    """
    import cv2

    folder = Path(folder)
    if not folder.is_dir():
        raise FileNotFoundError(f"image folder {folder} does not exist")
    paths = sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
    if not paths:
        raise FileNotFoundError(f"image folder {folder} holds no image ({', '.join(IMAGE_SUFFIXES)})")
    images = []
    for p in paths:
        image = cv2.imread(str(p), cv2.IMREAD_UNCHANGED)
        if image is None:
            raise ValueError(f"image {p} cannot be read (not an image, or truncated)")
        images.append((p.name, image))
    return images


def calibrate_intrinsics(images: Sequence[tuple[str, np.ndarray]], spec: BoardSpec, *, min_images: int = 6,
                         outlier_factor: float = 3.0, outlier_floor_px: float = 0.3, max_rounds: int = 3,
                         flags: int = 0) -> IntrinsicsResult:
    """Estimate K and distortion from images of the board.

    Args:
        images: ``(name, image)`` pairs, 8-bit gray or BGR, all the same size.
        spec: the board.
        min_images: fewest images with a detected board (and after outlier rejection).
        outlier_factor: an image is an outlier if its RMS error exceeds this many times the
            median image's (and ``outlier_floor_px``).
        outlier_floor_px: errors below this are never outliers (a very clean set would
            otherwise drop images for 0.2 px).
        max_rounds: re-solves after dropping outliers.
        flags: ``cv2.calibrateCamera`` flags (e.g. ``cv2.CALIB_FIX_K3``).

    Returns:
        The intrinsics, the RMS error, per-image errors, the dropped and the skipped images.

    Raises:
        TooFewSamplesError: fewer than ``min_images`` usable images.
        ValueError: naming an image whose size differs from the first image's.
    """
    import cv2

    from calibration.detection import detect_board

    if min_images < 3:
        raise ValueError(f"min_images must be >= 3, got {min_images}")
    observations, undetected, size = [], {}, None
    for name, image in images:
        shape = (image.shape[1], image.shape[0])
        if size is None:
            size = shape
        elif shape != size:
            raise ValueError(f"image {name} is {shape[0]}x{shape[1]} but the first image is {size[0]}x{size[1]}; "
                             "intrinsics hold for one resolution: use images of one stream and resolution")
        try:
            obs = detect_board(image, spec, name)
        except BoardNotDetectedError as e:
            undetected[name] = str(e)
            continue
        observations.append(obs)
    if len(observations) < min_images:
        raise TooFewSamplesError(f"the board was found in {len(observations)} of {len(images)} images; intrinsics "
                                 f"need >= {min_images} (better 15-30 views: near and far, tilted up to ~45 degrees, "
                                 "covering the image corners)")

    rejected: dict[str, float] = {}
    for round_ in range(max_rounds + 1):
        obj = [o.object_points.reshape(-1, 1, 3).astype(np.float32) for o in observations]
        img = [o.image_points.reshape(-1, 1, 2).astype(np.float32) for o in observations]
        rms, K, dist, _, _, _, _, per_view = cv2.calibrateCameraExtended(obj, img, size, None, None, flags=flags)
        errors = per_view.ravel()
        limit = max(outlier_factor * float(np.median(errors)), outlier_floor_px)
        bad = [i for i, e in enumerate(errors) if e > limit]
        if not bad or round_ == max_rounds or len(observations) - len(bad) < min_images:
            break
        rejected.update({observations[i].name: float(errors[i]) for i in bad})
        observations = [o for i, o in enumerate(observations) if i not in bad]
    if not math.isfinite(rms):
        raise TooFewSamplesError("calibrateCamera did not converge; add views at more distances and tilts")
    intrinsics = Intrinsics(int(size[0]), int(size[1]), K, dist.ravel())
    per_image = {o.name: float(e) for o, e in zip(observations, errors)}
    return IntrinsicsResult(intrinsics, float(rms), per_image, rejected, undetected)


def save_intrinsics(result: IntrinsicsResult, path: str | Path) -> Path:
    """Write ``intrinsics.json`` (its ``width``/``height``/``camera_matrix``/``dist_coeffs`` are
    what a session's ``intrinsics`` field holds)."""
    return write_json_atomic(path, result.to_dict())
