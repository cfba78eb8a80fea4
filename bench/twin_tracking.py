"""How much of a ``pd_ee_delta_pose`` target the twin's Panda reaches in one 0.2 s step, per base
axis and for rotations: the source of ``vla_envs.backends.franka.twin.TWIN_TRACKING_GAIN``.

    .venv/bin/python bench/twin_tracking.py      # ~20 s; prints one line per axis
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np

import vla_envs  # noqa: F401
from real_robot.transforms import euler_xyz_to_matrix, matrix_to_rotvec, quaternion_wxyz_to_matrix
from real_robot.twin_action import ROTATION_RAD_PER_UNIT, TRANSLATION_M_PER_UNIT
from vla_envs.backends.franka.twin import T_WORLD_FROM_BASE


def base_pose(state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    T_base_from_world = np.linalg.inv(T_WORLD_FROM_BASE)
    p = T_base_from_world[:3, :3] @ state[9:12] + T_base_from_world[:3, 3]
    return p, T_base_from_world[:3, :3] @ quaternion_wxyz_to_matrix(state[12:16])


def main(magnitude: float = 0.7, repeats: int = 2) -> None:
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=32, low_poly=True, assets="procedural",
                   vectorization="serial")
    obs, _ = env.reset(seed=0)
    fractions: dict[str, list[float]] = {}
    for _ in range(repeats):
        for axis, name in enumerate(("x", "y", "z", "rot_x", "rot_y", "rot_z")):
            for sign in (1.0, -1.0):
                a = np.zeros(7, np.float32)
                a[axis], a[6] = sign * magnitude, -1.0
                p0, R0 = base_pose(obs["state"][0])
                obs, *_ = env.step(a[None])
                p1, R1 = base_pose(obs["state"][0])
                if axis < 3:
                    f = (p1 - p0)[axis] / (a[axis] * TRANSLATION_M_PER_UNIT)
                else:
                    want = matrix_to_rotvec(euler_xyz_to_matrix(a[3:6] * ROTATION_RAD_PER_UNIT))
                    f = float(np.dot(matrix_to_rotvec(R1 @ R0.T), want) / np.dot(want, want))
                fractions.setdefault(name, []).append(float(f))
    env.close()
    for name, values in fractions.items():
        print(f"{name:6s} mean {np.mean(values):.3f}  (min {min(values):.3f}, max {max(values):.3f})")


if __name__ == "__main__":
    main()
