"""What a simulator backend implements so that ``ChunkVectorEnv`` can drive it.

Backends only adapt a simulator: episode bookkeeping (time limits, auto-reset, chunks,
metrics, initial-state ids) lives in ``ChunkVectorEnv`` and nowhere else.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field

import numpy as np
from gymnasium import spaces


@dataclass
class StepResult:
    """One batched simulator step.

    Attributes:
        obs: array observation fields, each ``[N, ...]``. Rows of envs that were not stepped
            (``active`` False) are ignored by the caller.
        reward: float32 ``[N]``.
        terminated: bool ``[N]``; the task's own termination (usually success).
        success: bool ``[N]``; whether the task is solved at this step.
        info: extra per-env arrays ``[N]`` passed through to the caller's info. ``"crashed"``
            (bool) marks envs whose simulator died and was replaced during this step: their
            episode ends as truncated, with ``truncation_reason`` ``"worker_crashed"``.
            Each of the backend's ``progress_flags`` is here too (bool ``[N]``).
    """

    obs: dict[str, np.ndarray]
    reward: np.ndarray
    terminated: np.ndarray
    success: np.ndarray
    info: dict[str, np.ndarray] = field(default_factory=dict)


class BatchedBackend(ABC):
    """A batch of ``num_envs`` simulated (or real) envs with the project's obs/action convention.

    Attributes:
        num_envs: batch size ``N``.
        single_observation_space: see ``vla_envs.core.spaces``.
        single_action_space: 7-D Box in [-1, 1].
        max_episode_steps: the task's time limit.
        num_initial_states: initial-state ids are integers in ``[0, num_initial_states)``;
            the same id always gives the same initial state.
        can_skip_envs: whether ``step`` can leave some envs untouched (a worker pool can; a
            GPU-batched simulator cannot).
        progress_flags: names of the task's sub-goals (``"grasped"``) that every ``step``
            reports in ``StepResult.info`` as bool ``[N]``: the partial-success measures of
            SimplerEnv-style evaluation. The vector env turns each into ``<name>_once`` in its
            episode metrics. Empty when the task reports none.
        episode_counters: names of per-step integer counts (e.g. the real robot's safety clamps)
            that every ``step`` reports in ``StepResult.info`` as int ``[N]``; the vector env sums
            each over the episode into its episode metrics under the same name.
    """

    num_envs: int
    single_observation_space: spaces.Dict
    single_action_space: spaces.Box
    max_episode_steps: int
    num_initial_states: int
    can_skip_envs: bool
    progress_flags: tuple[str, ...] = ()
    episode_counters: tuple[str, ...] = ()

    @abstractmethod
    def reset(
        self, env_ids: np.ndarray, state_ids: np.ndarray
    ) -> tuple[dict[str, np.ndarray], list[str]]:
        """Reset envs ``env_ids`` (int ``[K]``) to initial states ``state_ids`` (int ``[K]``).

        Returns:
            The array observation fields for those envs (``[K, ...]``) and their instructions.
        """

    @abstractmethod
    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        """Apply ``actions`` (float32 ``[N, 7]``, already validated) to envs where ``active``.

        A backend with ``can_skip_envs`` False steps every env regardless of ``active``.
        """

    def expert_state(self) -> dict[str, np.ndarray]:
        """The task's privileged state of every env, each field ``[N, ...]``: what a scripted
        expert and diagnostics read (poses the policy never observes). One call for the batch on
        every backend. Raises NotImplementedError for a backend or task without one."""
        raise NotImplementedError(f"{type(self).__name__} has no privileged expert state: scripted experts and "
                                  "expert_start_phases need a simulated task that defines expert_state")

    @abstractmethod
    def close(self) -> None:
        """Release every process, simulator and buffer. Idempotent."""


def stack_env_states(states: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """Per-env dicts of arrays -> one dict of ``[N, ...]`` arrays (the batched ``expert_state``)."""
    return {key: np.stack([np.asarray(s[key]) for s in states]) for key in states[0]}


def env_rows(batch: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The inverse: one dict per env, what the scripted experts' ``act`` reads."""
    n = len(next(iter(batch.values())))
    return [{key: value[i] for key, value in batch.items()} for i in range(n)]
