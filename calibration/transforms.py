"""Rigid transforms as 4x4 numpy arrays, and the few rotation helpers the solvers need.

``T_a_from_b`` maps a point in frame ``b`` to frame ``a``: ``p_a = T_a_from_b @ p_b``.
Pure numpy, so sessions and camera files can be read without OpenCV.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

# the rotation conversions are the robot side's (one implementation for the whole project)
from real_robot.transforms import matrix_to_rotvec, rotation_angle, rotvec_to_matrix  # noqa: F401


def make_transform(rotation: np.ndarray, translation: np.ndarray) -> np.ndarray:
    """The 4x4 transform of a 3x3 rotation and a translation (3 values, metres)."""
    T = np.eye(4)
    T[:3, :3] = rotation
    T[:3, 3] = np.asarray(translation, dtype=float).reshape(3)
    return T


def invert(T: np.ndarray) -> np.ndarray:
    """The inverse of a rigid transform (exact: R^T, -R^T t)."""
    R, t = T[:3, :3], T[:3, 3]
    return make_transform(R.T, -R.T @ t)


def rotation_angle_deg(R: np.ndarray) -> float:
    """The angle of a rotation matrix, in degrees [0, 180]."""
    return float(np.degrees(rotation_angle(R)))


def nearest_rotation(M: np.ndarray) -> np.ndarray:
    """The rotation closest to a 3x3 matrix in the Frobenius norm (SVD projection)."""
    U, _, Vt = np.linalg.svd(M)
    D = np.diag([1.0, 1.0, np.sign(np.linalg.det(U @ Vt))])
    return U @ D @ Vt


def mean_transform(transforms: Sequence[np.ndarray]) -> np.ndarray:
    """The average of rigid transforms: chordal mean of the rotations, mean of the translations.

    Exact for identical inputs and the least-squares answer for small spreads, which is what
    the solvers average (one fixed transform seen through many noisy samples).
    """
    stack = np.asarray(transforms, dtype=float)
    return make_transform(nearest_rotation(stack[:, :3, :3].sum(axis=0)), stack[:, :3, 3].mean(axis=0))


def transform_difference(T_a: np.ndarray, T_b: np.ndarray, point: np.ndarray | None = None) -> tuple[float, float]:
    """How far two transforms of the same frame disagree: (translation in mm, rotation in deg).

    Args:
        T_a, T_b: two estimates of the same ``T_x_from_y``.
        point: a point in frame ``y`` whose two images are compared (default: y's origin).

    Returns:
        ``(trans_mm, rot_deg)``: the distance between the point's two images in frame ``x``,
        and the angle of ``R_a^T R_b``.
    """
    p = np.zeros(3) if point is None else np.asarray(point, dtype=float)
    trans_m = np.linalg.norm((T_a[:3, :3] @ p + T_a[:3, 3]) - (T_b[:3, :3] @ p + T_b[:3, 3]))
    return float(trans_m * 1000.0), rotation_angle_deg(T_a[:3, :3].T @ T_b[:3, :3])


def check_transform(value, what: str, atol: float = 1e-4) -> np.ndarray:
    """``value`` as a 4x4 rigid transform, or a ValueError naming ``what``.

    Args:
        value: nested lists or an array.
        what: how the error names the value (a file and field).
        atol: tolerance of the rotation's orthonormality (values are read from JSON).

    Raises:
        ValueError: if the shape is not 4x4, a value is not finite, the rotation block is not a
            rotation (R R^T = I, det +1) or the last row is not [0, 0, 0, 1].
    """
    try:
        T = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a 4x4 matrix of numbers, got {value!r:.80}") from None
    if T.shape != (4, 4):
        raise ValueError(f"{what} must be a 4x4 homogeneous transform, got shape {T.shape}")
    if not np.isfinite(T).all():
        raise ValueError(f"{what} has values that are not finite")
    R = T[:3, :3]
    if not np.allclose(R @ R.T, np.eye(3), atol=atol) or np.linalg.det(R) < 0:
        raise ValueError(f"{what} is not a rigid transform: its 3x3 block is not a rotation (R R^T = I, det R = +1)")
    if not np.allclose(T[3], [0.0, 0.0, 0.0, 1.0]):
        raise ValueError(f"{what} is not a rigid transform: its last row must be [0, 0, 0, 1], got {T[3].tolist()}")
    return T
