"""One ManiSkill env on the CPU PhysX backend, as a ``TaskEnv`` for the worker pool."""

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
from vla_envs.core.spaces import make_action_space, make_observation_space
from vla_envs.core.task_env import TaskEnv


class ManiSkillTaskEnv(TaskEnv):
    """A ManiSkill task (``num_envs=1``, ``physx_cpu``) speaking the project's convention.

    Args:
        task: ManiSkill env id, e.g. ``"PickCube-v1"``.
        instruction: the instruction of every episode; None: the task's own per-episode
            ``instruction`` attribute.
        image_hw: camera resolution (height, width); None: the task sizes its cameras.
        reward_mode: ManiSkill reward mode (``"normalized_dense"``, ``"dense"``, ``"sparse"``).
        obs_mode: ManiSkill observation mode (an rgb mode).
        register_module: module to import first that registers ``task`` with ManiSkill.
        env_kwargs: passed to ManiSkill's ``gym.make``.

    Initial-state ids are the task's ``episode_id`` when it has ``num_episodes``, else the
    ManiSkill episode seed.
    """

    metadata = {"render_modes": []}

    def __init__(self, task: str, instruction: str | None, image_hw: tuple[int, int] | None = (128, 128),
                 reward_mode: str = "normalized_dense", obs_mode: str = "rgb",
                 register_module: str | None = None, **env_kwargs: Any):
        self.task = task
        self.fixed_instruction = instruction
        self.max_episode_steps = registered_max_steps(task, register_module)
        self._env = make_maniskill_env(task, 1, "physx_cpu", image_hw, reward_mode, obs_mode,
                                       register_module, **env_kwargs)
        self.num_initial_states = episode_space(self._env.unwrapped)
        raw, info = self._env.reset(**reset_kwargs(self._env.unwrapped, [0]))
        self.progress_flags = progress_flags(info)
        obs = convert_obs(raw)
        self.observation_space = make_observation_space(obs["image"].shape[1:3], obs["state"].shape[-1])
        self.action_space = make_action_space()

    def _obs(self, raw: dict[str, Any]) -> dict[str, Any]:
        obs = convert_obs(raw)
        text = self.fixed_instruction or self._env.unwrapped.instruction[0]
        return {"image": obs["image"][0], "state": obs["state"][0], "instruction": text}

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        raw, _ = self._env.reset(**reset_kwargs(self._env.unwrapped, [self.state_id_from(seed, options)]))
        return self._obs(raw), {}

    def step(self, action: np.ndarray):
        raw, reward, terminated, _, info = self._env.step(to_maniskill_action(action)[None])
        success = bool(to_numpy(info["success"]).reshape(-1)[0]) if "success" in info else False
        progress = {name: bool(v[0]) for name, v in progress_values(info, self.progress_flags).items()}
        return (self._obs(raw), float(to_numpy(reward).reshape(-1)[0]),
                bool(to_numpy(terminated).reshape(-1)[0]), False, {"success": success, **progress})

    def expert_state(self) -> dict[str, np.ndarray] | None:
        """The task's privileged state for scripted experts (row 0 of its batch of one); None for a
        task without one (ManiSkill's own tasks), which the backends report as NotImplementedError."""
        unwrapped = self._env.unwrapped
        if not hasattr(unwrapped, "expert_state"):
            return None
        return {k: v[0] for k, v in unwrapped.expert_state().items()}

    def close(self) -> None:
        self._env.close()
