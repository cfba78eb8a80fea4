"""ChArUco corners in an image, and the board's pose in the camera from them.

Corners are re-refined here rather than taken from ``CharucoDetector`` as they come, for two
reasons found on rendered boards with known corners:

* OpenCV before the fix of opencv/opencv#25539 (PR #28380) returns every corner shifted by
  +0.5 px in x and y, which tilts the camera by ~0.05 deg and moves the board by ~0.5 mm at
  1 m. ``cv2.cornerSubPix`` works in absolute pixel coordinates and converges to the true
  saddle point, so refining again removes the shift with any OpenCV version.
* Its refinement window can reach into the ArUco markers next to a corner when the board is
  small or tilted in the image, pulling that corner by up to ~1.5 px. Each corner's window
  here is sized from where the nearest marker corners project (through the board-to-image
  homography of the detected corners), so it sees only the chessboard's own edges.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from calibration.board import BoardSpec, cv_board
from calibration.errors import BoardNotDetectedError
from calibration.transforms import make_transform, rotvec_to_matrix, matrix_to_rotvec

MIN_CORNERS = 6  # PnP on a plane needs 4; 6 keeps one bad corner from deciding the pose
MAX_HALF_WINDOW_PX = 5


@dataclass(frozen=True)
class BoardObservation:
    """The ChArUco corners found in one image."""

    name: str
    """The image's name (file name in a session), used in every error about it."""
    ids: np.ndarray
    """Corner ids, ``[N]`` int (row-major from the board's top-left inner corner)."""
    image_points: np.ndarray
    """Corner positions, ``[N, 2]`` pixels (OpenCV convention: pixel centres at integers)."""
    object_points: np.ndarray
    """The same corners in the board frame, ``[N, 3]`` metres."""
    image_size: tuple[int, int]
    """``(width, height)`` of the image."""


@lru_cache(maxsize=8)
def _detector(spec: BoardSpec):
    import cv2

    return cv2.aruco.CharucoDetector(cv_board(spec))


def refine_corners(gray: np.ndarray, spec: BoardSpec, object_points: np.ndarray, image_points: np.ndarray,
                   max_half_window_px: int = MAX_HALF_WINDOW_PX) -> np.ndarray:
    """Sub-pixel corner positions, each refined in a window free of marker edges.

    Args:
        gray: the 8-bit grayscale image.
        spec: the board.
        object_points: ``[N, 3]`` the corners in the board frame.
        image_points: ``[N, 2]`` their detected positions (initial guesses).
        max_half_window_px: the largest half window (OpenCV's default ChArUco window is 5).

    Returns:
        ``[N, 2]`` refined positions (pixel centres at integer coordinates).
    """
    import cv2

    board_xy = object_points[:, :2].astype(np.float64)
    H, _ = cv2.findHomography(board_xy, image_points.astype(np.float64))
    if H is None:
        return image_points
    # the marker corners nearest a chess corner sit (margin, margin) away diagonally; an
    # axis-aligned window of half size w excludes a point whose Chebyshev distance exceeds w,
    # and the gradient operator reaches one pixel further
    margin_m = (spec.square_length_m - spec.marker_length_m) / 2.0
    offsets = np.array([[1.0, 1.0], [1.0, -1.0], [-1.0, 1.0], [-1.0, -1.0]]) * margin_m
    around = cv2.perspectiveTransform((board_xy[:, None, :] + offsets[None]).reshape(-1, 1, 2), H)
    centre = cv2.perspectiveTransform(board_xy.reshape(-1, 1, 2), H)
    chebyshev = np.abs(around.reshape(-1, 4, 2) - centre.reshape(-1, 1, 2)).max(axis=2).min(axis=1)
    half = np.clip(np.floor(chebyshev - 1.5), 2, max_half_window_px).astype(int)
    refined = image_points.astype(np.float32).copy()
    criteria = (cv2.TERM_CRITERIA_EPS + cv2.TERM_CRITERIA_MAX_ITER, 100, 0.001)
    for w in np.unique(half):
        chosen = half == w
        points = refined[chosen].reshape(-1, 1, 2)
        cv2.cornerSubPix(gray, points, (int(w), int(w)), (-1, -1), criteria)
        refined[chosen] = points.reshape(-1, 2)
    return refined.astype(np.float64)


def to_gray(image: np.ndarray, name: str) -> np.ndarray:
    """An 8-bit grayscale view of an image (gray, BGR or BGRA).

    Raises:
        BoardNotDetectedError: naming the image if it is empty or not an 8-bit image.
    """
    image = np.asarray(image)
    if image.size == 0 or image.dtype != np.uint8 or image.ndim not in (2, 3):
        raise BoardNotDetectedError(f"image {name} is not an 8-bit gray or color image "
                                    f"(dtype {image.dtype}, shape {image.shape})", name)
    if image.ndim == 2:
        return image
    import cv2

    if image.shape[2] == 3:
        return cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    if image.shape[2] == 4:
        return cv2.cvtColor(image, cv2.COLOR_BGRA2GRAY)
    raise BoardNotDetectedError(f"image {name} has {image.shape[2]} channels; allowed: 1, 3 (BGR) or 4 (BGRA)", name)


def detect_board(image: np.ndarray, spec: BoardSpec, name: str, min_corners: int = MIN_CORNERS) -> BoardObservation:
    """Find the board's ChArUco corners in an image.

    Args:
        image: 8-bit gray or BGR image.
        spec: the board printed.
        name: how errors name the image (its file name).
        min_corners: fewest corners accepted.

    Returns:
        The corners with their board coordinates, re-refined (see the module doc).

    Raises:
        BoardNotDetectedError: naming the image, if fewer than ``min_corners`` corners are
            found or they all lie on one row or column (no pose from a line).
    """
    gray = to_gray(image, name)
    corners, ids, _, marker_ids = _detector(spec).detectBoard(gray)
    n_markers = 0 if marker_ids is None else len(marker_ids)
    n_corners = 0 if ids is None else len(ids)
    if n_corners < min_corners:
        raise BoardNotDetectedError(
            f"board not detected in {name}: {n_corners} ChArUco corners ({n_markers} markers) found, need >= "
            f"{min_corners}. Is the whole board in view, sharp and evenly lit, and is the board spec "
            f"({spec.describe()}) the one printed?", name)
    ids = ids.ravel().astype(int)
    cols, rows = ids % (spec.squares_x - 1), ids // (spec.squares_x - 1)
    if len(np.unique(cols)) < 2 or len(np.unique(rows)) < 2:
        raise BoardNotDetectedError(f"board in {name}: the {n_corners} corners found lie on one line; "
                                    "a pose needs corners from at least two rows and two columns", name)
    object_points = spec.corners_m()[ids]
    points = refine_corners(gray, spec, object_points, corners.reshape(-1, 2))
    return BoardObservation(name, ids, points, object_points, (gray.shape[1], gray.shape[0]))


def board_pose(obs: BoardObservation, camera_matrix: np.ndarray, dist_coeffs: np.ndarray | None = None
               ) -> tuple[np.ndarray, float]:
    """The board's pose in the camera from its corners (PnP).

    IPPE, made for planar targets, gives the pose (and resolves the plane's two-fold
    ambiguity); Levenberg-Marquardt then refines it on all corners.

    Returns:
        ``(T_cam_from_board, rms_px)``: the 4x4 pose and the corners' RMS reprojection error.
    """
    import cv2

    K = np.asarray(camera_matrix, dtype=float)
    dist = np.zeros(5) if dist_coeffs is None else np.asarray(dist_coeffs, dtype=float).ravel()
    obj = obs.object_points.reshape(-1, 1, 3)
    img = obs.image_points.reshape(-1, 1, 2)
    ok, rvec, tvec = cv2.solvePnP(obj, img, K, dist, flags=cv2.SOLVEPNP_IPPE)
    if not ok:
        raise BoardNotDetectedError(f"board in {obs.name}: PnP found no pose for the {len(obs.ids)} corners", obs.name)
    rvec, tvec = cv2.solvePnPRefineLM(obj, img, K, dist, rvec, tvec)
    projected, _ = cv2.projectPoints(obj, rvec, tvec, K, dist)
    rms_px = float(np.sqrt(np.mean(np.sum((projected.reshape(-1, 2) - obs.image_points) ** 2, axis=1))))
    return make_transform(rotvec_to_matrix(rvec.ravel()), tvec.ravel()), rms_px


def pose_to_rvec_tvec(T: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A 4x4 transform as OpenCV's (rvec, tvec) column vectors."""
    return matrix_to_rotvec(T[:3, :3]).reshape(3, 1), T[:3, 3].reshape(3, 1).copy()
