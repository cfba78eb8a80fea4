"""One ManiSkill env on the CPU PhysX backend, as a ``TaskEnv`` for the worker pool."""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_envs.backends.maniskill.common import (
    convert_obs,
    make_maniskill_env,
    registered_max_steps,
    to_maniskill_action,
    to_numpy,
)
from vla_envs.core.spaces import make_action_space, make_observation_space
from vla_envs.core.task_env import TaskEnv

SEED_SPACE = 2**31 - 1  # initial-state id = ManiSkill episode seed


class ManiSkillTaskEnv(TaskEnv):
    """A ManiSkill task (``num_envs=1``, ``physx_cpu``) speaking the project's convention.

    Args:
        task: ManiSkill env id, e.g. ``"PickCube-v1"``.
        instruction: the language instruction of every episode.
        image_hw: camera resolution (height, width).
        reward_mode: ManiSkill reward mode (``"normalized_dense"``, ``"dense"``, ``"sparse"``).
        env_kwargs: passed to ManiSkill's ``gym.make``.
    """

    metadata = {"render_modes": []}
    num_initial_states = SEED_SPACE

    def __init__(self, task: str, instruction: str, image_hw: tuple[int, int] = (128, 128),
                 reward_mode: str = "normalized_dense", **env_kwargs: Any):
        self.task = task
        self.instruction = instruction
        self.max_episode_steps = registered_max_steps(task)
        self._env = make_maniskill_env(task, 1, "physx_cpu", image_hw, reward_mode, **env_kwargs)
        raw, _ = self._env.reset(seed=0)
        state_dim = convert_obs(raw)["state"].shape[-1]
        self.observation_space = make_observation_space(image_hw, state_dim)
        self.action_space = make_action_space()

    def _obs(self, raw: dict[str, Any]) -> dict[str, Any]:
        obs = convert_obs(raw)
        return {"image": obs["image"][0], "state": obs["state"][0], "instruction": self.instruction}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        raw, _ = self._env.reset(seed=self.state_id_from(seed, options))
        return self._obs(raw), {}

    def step(self, action: np.ndarray):
        raw, reward, terminated, _, info = self._env.step(to_maniskill_action(action)[None])
        success = bool(to_numpy(info["success"]).reshape(-1)[0]) if "success" in info else False
        return (self._obs(raw), float(to_numpy(reward).reshape(-1)[0]),
                bool(to_numpy(terminated).reshape(-1)[0]), False, {"success": success})

    def close(self) -> None:
        self._env.close()
