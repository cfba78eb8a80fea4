"""``TaskEnv``: one env of a CPU backend, the unit a worker process runs.

A ``TaskEnv`` is a plain ``gymnasium.Env`` (Gymnasium's env checker applies to it) whose
observation is the project's dict (``vla_envs.core.spaces``) and whose action is the 7-D
normalised delta-EEF + gripper action. Its episodes never time out by themselves: the time
limit is applied by ``ChunkVectorEnv``.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym


class TaskEnv(gym.Env):
    """Base class of single envs run by ``SerialBackend`` and ``ProcessPoolBackend``.

    Subclasses set:
        max_episode_steps: the task's time limit (applied by the vector env).
        num_initial_states: initial-state ids are ``0..num_initial_states-1``.
        progress_flags: optional sub-goal names; ``step`` then returns each in its info as a
            bool (see ``BatchedBackend.progress_flags``).

    ``reset(seed=..., options={"state_id": k})`` must put the env in initial state ``k``
    deterministically; ``step`` returns ``info["success"]`` (bool) and ``truncated`` False.
    """

    max_episode_steps: int
    num_initial_states: int
    progress_flags: tuple[str, ...] = ()

    @staticmethod
    def state_id_from(seed: int | None, options: dict[str, Any] | None) -> int:
        """The initial-state id a reset asks for: ``options["state_id"]``, else the seed."""
        if options and "state_id" in options:
            return int(options["state_id"])
        return int(seed or 0)
