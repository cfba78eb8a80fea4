"""Rotation conversions in numpy (no scipy): rotation vectors, matrices, wxyz quaternions, and the
intrinsic XYZ Euler angles ManiSkill's end-effector controllers use.

Conventions: a rotation vector is axis * angle (rad); quaternions are (w, x, y, z) with w >= 0,
ManiSkill's order (franky's ``Affine.quaternion`` is (x, y, z, w)); a transform ``T_a_from_b`` maps
points in frame b to frame a.
"""

from __future__ import annotations

from typing import Any


def rotvec_to_matrix(rotvec: Any) -> Any:
    """Rotation vector (axis * angle, rad) ``[3]`` -> rotation matrix ``[3, 3]`` (Rodrigues)."""
    import numpy as np

    rotvec = np.asarray(rotvec, dtype=np.float64).reshape(3)
    angle = float(np.linalg.norm(rotvec))
    if angle < 1e-12:
        return np.eye(3)
    k = rotvec / angle
    K = np.array([[0.0, -k[2], k[1]], [k[2], 0.0, -k[0]], [-k[1], k[0], 0.0]])
    return np.eye(3) + np.sin(angle) * K + (1.0 - np.cos(angle)) * (K @ K)


def matrix_to_rotvec(R: Any) -> Any:
    """Rotation matrix ``[3, 3]`` -> rotation vector ``[3]`` with angle in ``[0, pi]``."""
    import numpy as np

    # Through the quaternion: stable near 0 and near pi, where the matrix log is ill-conditioned.
    w, x, y, z = matrix_to_quaternion_wxyz(R)
    vec = np.array([x, y, z])
    s = float(np.linalg.norm(vec))
    if s < 1e-12:
        return np.zeros(3)
    angle = 2.0 * np.arctan2(s, w)
    return vec / s * angle


def matrix_to_quaternion_wxyz(R: Any) -> Any:
    """Rotation matrix ``[3, 3]`` -> unit quaternion ``(w, x, y, z)`` with ``w >= 0``."""
    import numpy as np

    R = np.asarray(R, dtype=np.float64).reshape(3, 3)
    trace = R[0, 0] + R[1, 1] + R[2, 2]
    # Shepperd's method: divide by the largest of the four candidates.
    if trace > 0:
        s = 2.0 * np.sqrt(trace + 1.0)
        q = [0.25 * s, (R[2, 1] - R[1, 2]) / s, (R[0, 2] - R[2, 0]) / s, (R[1, 0] - R[0, 1]) / s]
    elif R[0, 0] > R[1, 1] and R[0, 0] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[0, 0] - R[1, 1] - R[2, 2])
        q = [(R[2, 1] - R[1, 2]) / s, 0.25 * s, (R[0, 1] + R[1, 0]) / s, (R[0, 2] + R[2, 0]) / s]
    elif R[1, 1] > R[2, 2]:
        s = 2.0 * np.sqrt(1.0 + R[1, 1] - R[0, 0] - R[2, 2])
        q = [(R[0, 2] - R[2, 0]) / s, (R[0, 1] + R[1, 0]) / s, 0.25 * s, (R[1, 2] + R[2, 1]) / s]
    else:
        s = 2.0 * np.sqrt(1.0 + R[2, 2] - R[0, 0] - R[1, 1])
        q = [(R[1, 0] - R[0, 1]) / s, (R[0, 2] + R[2, 0]) / s, (R[1, 2] + R[2, 1]) / s, 0.25 * s]
    q = np.array(q)
    q /= np.linalg.norm(q)
    return -q if q[0] < 0 else q


def quaternion_wxyz_to_matrix(q: Any) -> Any:
    """Quaternion ``(w, x, y, z)`` (normalised here) -> rotation matrix ``[3, 3]``.

    Raises:
        ValueError: not finite, or (near) zero: no rotation (a default-constructed ROS message's).
    """
    import numpy as np

    q = np.asarray(q, dtype=np.float64).reshape(4)
    norm = float(np.linalg.norm(q))
    if not np.isfinite(norm) or norm < 1e-6:
        raise ValueError(f"quaternion (w, x, y, z) {q.tolist()} is not a rotation")
    w, x, y, z = q / norm
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def is_rigid_transform(T: Any, tol: float = 1e-5) -> bool:
    """Whether ``T`` is a finite ``[4, 4]`` homogeneous transform with a proper rotation."""
    import numpy as np

    T = np.asarray(T, dtype=np.float64)
    if T.shape != (4, 4) or not np.isfinite(T).all():
        return False
    R = T[:3, :3]
    return bool(np.abs(R.T @ R - np.eye(3)).max() < tol and np.linalg.det(R) > 0 and
                np.array_equal(T[3], [0.0, 0.0, 0.0, 1.0]))


def euler_xyz_to_matrix(angles_rad: Any) -> Any:
    """Intrinsic XYZ Euler angles ``[3]`` -> ``Rx(a) @ Ry(b) @ Rz(c)``, the convention of
    ManiSkill's ``euler_angles_to_matrix(angles, "XYZ")`` (pytorch3d's)."""
    import numpy as np

    a, b, c = np.asarray(angles_rad, dtype=np.float64).reshape(3)
    Rx = np.array([[1, 0, 0], [0, np.cos(a), -np.sin(a)], [0, np.sin(a), np.cos(a)]])
    Ry = np.array([[np.cos(b), 0, np.sin(b)], [0, 1, 0], [-np.sin(b), 0, np.cos(b)]])
    Rz = np.array([[np.cos(c), -np.sin(c), 0], [np.sin(c), np.cos(c), 0], [0, 0, 1]])
    return Rx @ Ry @ Rz


def matrix_to_euler_xyz(R: Any) -> Any:
    """Rotation matrix -> intrinsic XYZ Euler angles ``[3]``, the inverse of ``euler_xyz_to_matrix``
    for ``|b| < pi/2``."""
    import numpy as np

    R = np.asarray(R, dtype=np.float64).reshape(3, 3)
    # R = Rx(a) Ry(b) Rz(c): R[0, 2] = sin b, R[1, 2] = -sin a cos b, R[0, 1] = -cos b sin c.
    b = np.arcsin(np.clip(R[0, 2], -1.0, 1.0))
    a = np.arctan2(-R[1, 2], R[2, 2])
    c = np.arctan2(-R[0, 1], R[0, 0])
    return np.array([a, b, c])


def rotation_angle(R: Any) -> float:
    """The angle (rad, in ``[0, pi]``) of a rotation matrix."""
    import numpy as np

    cos = (np.trace(np.asarray(R, dtype=np.float64)) - 1.0) / 2.0
    return float(np.arccos(np.clip(cos, -1.0, 1.0)))


def pose_matrix(position: Any, R: Any) -> Any:
    """Position ``[3]`` and rotation ``[3, 3]`` -> homogeneous transform ``[4, 4]``."""
    import numpy as np

    T = np.eye(4)
    T[:3, :3] = np.asarray(R, dtype=np.float64).reshape(3, 3)
    T[:3, 3] = np.asarray(position, dtype=np.float64).reshape(3)
    return T
