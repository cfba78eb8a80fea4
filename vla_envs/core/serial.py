"""``SerialBackend``: ``TaskEnv`` instances stepped one after another in this process.

For tests, debugging and envs cheap enough that processes cost more than they save.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from vla_envs.core.backend import BatchedBackend, StepResult, stack_env_states
from vla_envs.core.spaces import array_keys
from vla_envs.core.task_env import TaskEnv


def check_same_spaces(envs_spaces: list[tuple], what: str = "env") -> None:
    """Every env of a batch must have the spaces of the first (as Gymnasium's vector envs require)."""
    first = envs_spaces[0]
    for i, spaces in enumerate(envs_spaces[1:], start=1):
        if spaces != first:
            raise RuntimeError(
                f"{what} {i} has spaces {spaces}, different from {what} 0's {first}; "
                "every env of one vector env must share observation and action spaces"
            )


class SerialBackend(BatchedBackend):
    """Runs ``len(env_fns)`` ``TaskEnv`` in this process."""

    can_skip_envs = True

    def __init__(self, env_fns: list[Callable[[], TaskEnv]]):
        if not env_fns:
            raise ValueError("num_envs must be >= 1")
        self.envs = [fn() for fn in env_fns]
        first = self.envs[0]
        check_same_spaces([(e.observation_space, e.action_space) for e in self.envs])
        self.num_envs = len(self.envs)
        self.single_observation_space = first.observation_space
        self.single_action_space = first.action_space
        self.max_episode_steps = first.max_episode_steps
        self.num_initial_states = first.num_initial_states
        self.progress_flags = tuple(first.progress_flags)
        self._keys = array_keys(self.single_observation_space)
        self._last = {k: np.zeros((self.num_envs,) + self.single_observation_space[k].shape,
                                  self.single_observation_space[k].dtype) for k in self._keys}

    def reset(self, env_ids: np.ndarray, state_ids: np.ndarray):
        instructions = []
        for i, sid in zip(env_ids, state_ids):
            obs, _ = self.envs[i].reset(options={"state_id": int(sid)})
            for k in self._keys:
                self._last[k][i] = obs[k]
            instructions.append(obs["instruction"])
        return {k: self._last[k][env_ids].copy() for k in self._keys}, instructions

    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        n = self.num_envs
        reward, terminated, success = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        progress = {name: np.zeros(n, bool) for name in self.progress_flags}
        for i in np.flatnonzero(active):
            obs, r, term, _, info = self.envs[i].step(actions[i])
            for k in self._keys:
                self._last[k][i] = obs[k]
            reward[i], terminated[i], success[i] = r, term, bool(info["success"])
            for name, flags in progress.items():
                flags[i] = bool(info[name])
        return StepResult(self._last, reward, terminated, success, progress)

    def call(self, env_index: int, method: str, *args, **kwargs):
        """Call ``method`` on one ``TaskEnv`` (same as ``ProcessPoolBackend.call``)."""
        return getattr(self.envs[env_index], method)(*args, **kwargs)

    def expert_state(self) -> dict[str, np.ndarray]:
        """Every env's ``TaskEnv.expert_state()``, stacked ``[N, ...]``."""
        states = [env.expert_state() if hasattr(env, "expert_state") else None for env in self.envs]
        if any(state is None for state in states):  # the task has no privileged state
            return super().expert_state()
        return stack_env_states(states)

    def close(self) -> None:
        for env in self.envs:
            env.close()
        self.envs = []
