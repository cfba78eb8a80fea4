"""The expert's privileged scene poses as training targets.

Demos recorded by the scripted expert carry ``scene`` poses ``[T, 7 K]`` (per body xyz + wxyz;
the bodies are named in ``index.json`` ``scene_bodies``). They exist only in simulation and only
for training; the policy never receives them. ``scene_targets`` turns them into ``[T, 5 K]``
targets: per body ``x, y, z, cos 2 yaw, sin 2 yaw`` (yaw modulo pi: a gripper and most objects
look the same turned half a turn).
"""

from __future__ import annotations

import numpy as np

TARGETS_PER_BODY = ("x", "y", "z", "cos2yaw", "sin2yaw")


def yaw_of_wxyz(q: np.ndarray) -> np.ndarray:
    """Yaw (rotation about world z) of quaternions ``[..., 4]`` (w, x, y, z), in radians."""
    w, x, y, z = np.moveaxis(q, -1, 0)
    return np.arctan2(2.0 * (w * z + x * y), 1.0 - 2.0 * (y * y + z * z))


def scene_targets(scene: np.ndarray) -> np.ndarray:
    """Poses float ``[T, 7 K]`` (per body xyz + wxyz) -> targets float32 ``[T, 5 K]`` (per body
    ``TARGETS_PER_BODY``)."""
    T, width = scene.shape
    if width % 7:
        raise ValueError(f"scene has {width} columns; expected 7 per body (xyz + wxyz)")
    poses = scene.reshape(T, width // 7, 7)
    yaw2 = 2.0 * yaw_of_wxyz(poses[..., 3:])
    return np.concatenate([poses[..., :3], np.cos(yaw2)[..., None], np.sin(yaw2)[..., None]], -1).reshape(T, -1).astype(np.float32)
