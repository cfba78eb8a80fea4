"""ManiSkill's GPU-batched PhysX backend: all ``N`` envs in one process, one CUDA scene."""

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
from vla_envs.backends.maniskill.task_env import SEED_SPACE
from vla_envs.core.backend import BatchedBackend, StepResult
from vla_envs.core.spaces import make_action_space, make_observation_space


class ManiSkillGPUBackend(BatchedBackend):
    """``num_envs`` ManiSkill envs batched on the GPU. All envs step together
    (``can_skip_envs`` False); partial resets use ManiSkill's ``env_idx`` option."""

    can_skip_envs = False
    num_initial_states = SEED_SPACE

    def __init__(self, task: str, instruction: str, num_envs: int,
                 image_hw: tuple[int, int] = (128, 128), reward_mode: str = "normalized_dense",
                 **env_kwargs: Any):
        self.num_envs = num_envs
        self.instruction = instruction
        self.max_episode_steps = registered_max_steps(task)
        self._env = make_maniskill_env(task, num_envs, "physx_cuda", image_hw, reward_mode, **env_kwargs)
        raw, _ = self._env.reset(seed=list(range(num_envs)))
        state_dim = convert_obs(raw)["state"].shape[-1]
        self.single_observation_space = make_observation_space(image_hw, state_dim)
        self.single_action_space = make_action_space()

    def reset(self, env_ids: np.ndarray, state_ids: np.ndarray):
        import torch

        idx = torch.as_tensor(env_ids, dtype=torch.int64)
        raw, _ = self._env.reset(seed=[int(s) for s in state_ids], options={"env_idx": idx})
        obs = convert_obs(raw)
        return {k: v[env_ids] for k, v in obs.items()}, [self.instruction] * len(env_ids)

    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        import torch

        raw, reward, terminated, _, info = self._env.step(torch.as_tensor(to_maniskill_action(actions)))
        n = self.num_envs
        success = to_numpy(info["success"]).astype(bool) if "success" in info else np.zeros(n, bool)
        return StepResult(convert_obs(raw), to_numpy(reward).astype(np.float32),
                          to_numpy(terminated).astype(bool), success)

    def close(self) -> None:
        self._env.close()
