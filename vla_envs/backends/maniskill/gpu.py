"""ManiSkill's GPU-batched PhysX backend: all ``N`` envs in one process, one CUDA scene."""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_envs.backends.maniskill.common import (
    convert_obs,
    episode_space,
    make_maniskill_env,
    progress_flags,
    progress_values,
    registered_max_steps,
    reset_kwargs,
    to_maniskill_action,
    to_numpy,
)
from vla_envs.core.backend import BatchedBackend, StepResult
from vla_envs.core.spaces import make_action_space, make_observation_space


class ManiSkillGPUBackend(BatchedBackend):
    """``num_envs`` ManiSkill envs batched on the GPU. All envs step together
    (``can_skip_envs`` False); partial resets use ManiSkill's ``env_idx`` option. Arguments
    as ``ManiSkillTaskEnv``'s, plus ``sim_backend``: ``"physx_cuda"``, or ``"physx_cpu"`` with
    ``num_envs=1`` to run this batched, in-process code path where there is no GPU (the tests)."""

    can_skip_envs = False

    def __init__(self, task: str, instruction: str | None, num_envs: int,
                 image_hw: tuple[int, int] | None = (128, 128), reward_mode: str = "normalized_dense",
                 obs_mode: str = "rgb", register_module: str | None = None, sim_backend: str = "physx_cuda",
                 **env_kwargs: Any):
        if sim_backend == "physx_cpu" and num_envs != 1:
            raise ValueError(f"sim_backend='physx_cpu' batches one env in a process, got num_envs={num_envs}")
        self.num_envs = num_envs
        self.fixed_instruction = instruction
        self.max_episode_steps = registered_max_steps(task, register_module)
        self._env = make_maniskill_env(task, num_envs, sim_backend, image_hw, reward_mode, obs_mode,
                                       register_module, **env_kwargs)
        self.num_initial_states = episode_space(self._env.unwrapped)
        self.ids_fix_states = num_envs == 1 or hasattr(self._env.unwrapped, "num_episodes")
        """Whether an initial-state id alone fixes an env's initial state. ManiSkill's own tasks draw a
        reset's states from one torch stream seeded by the first env's seed, so in a batch an env's
        state also depends on its place among the envs reset with it; tasks that decode their ids
        (PutOnPlate's ``episode_id``) do not."""
        raw, info = self._env.reset(**reset_kwargs(self._env.unwrapped, list(range(num_envs))))
        self.progress_flags = progress_flags(info)
        obs = convert_obs(raw)
        self.single_observation_space = make_observation_space(obs["image"].shape[1:3], obs["state"].shape[-1])
        self.single_action_space = make_action_space()

    def reset(self, env_ids: np.ndarray, state_ids: np.ndarray):
        import torch

        kwargs = reset_kwargs(self._env.unwrapped, list(state_ids))
        kwargs["seed"] = [int(s) for s in state_ids]
        kwargs.setdefault("options", {})["env_idx"] = torch.as_tensor(env_ids, dtype=torch.int64)
        raw, _ = self._env.reset(**kwargs)
        obs = convert_obs(raw)
        texts = ([self.fixed_instruction] * self.num_envs if self.fixed_instruction
                 else list(self._env.unwrapped.instruction))
        return {k: v[env_ids] for k, v in obs.items()}, [texts[i] for i in env_ids]

    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        import torch

        raw, reward, terminated, _, info = self._env.step(torch.as_tensor(to_maniskill_action(actions)))
        n = self.num_envs
        success = to_numpy(info["success"]).astype(bool) if "success" in info else np.zeros(n, bool)
        return StepResult(convert_obs(raw), to_numpy(reward).astype(np.float32),
                          to_numpy(terminated).astype(bool), success, progress_values(info, self.progress_flags))

    def expert_state(self) -> dict[str, np.ndarray]:
        """The task's privileged state of the whole batch, one call (``[N, ...]`` arrays)."""
        unwrapped = self._env.unwrapped
        if not hasattr(unwrapped, "expert_state"):
            return super().expert_state()
        return {key: to_numpy(value) for key, value in unwrapped.expert_state().items()}

    def close(self) -> None:
        self._env.close()
