"""A small deterministic pure-Python ``TaskEnv`` for testing the contract. It stands in for
no real simulator: its only job is to make done patterns controllable and every number
checkable by hand.

Dynamics: the image is filled with ``(state_id + t) % 256``; ``state = [t, state_id, a0]``.
Success (and termination) happens at the sub-step where the action's gripper dim exceeds
0.5. Reward: 1.0 on success, else ``0.1``.
"""

from __future__ import annotations

import os

import numpy as np

from vla_envs.core.spaces import make_action_space, make_observation_space
from vla_envs.core.task_env import TaskEnv

H = W = 4


class ToyEnv(TaskEnv):
    metadata = {"render_modes": []}
    num_initial_states = 1000

    def __init__(self, max_episode_steps: int = 10):
        self.max_episode_steps = max_episode_steps
        self.observation_space = make_observation_space((H, W), state_dim=3)
        self.action_space = make_action_space()
        self._t = 0
        self._sid = 0
        self._fail = None
        self._was_reset = False

    def _obs(self, a0: float = 0.0):
        img = np.full((H, W, 3), (self._sid + self._t) % 256, np.uint8)
        state = np.array([self._t, self._sid, a0], np.float32)
        return {"image": img, "state": state, "instruction": f"count from {self._sid}"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._sid = self.state_id_from(seed, options)
        self._t = 0
        self._was_reset = True
        return self._obs(), {}

    def step(self, action):
        if not self._was_reset:  # as LIBERO's env, which has no simulator before its first reset
            raise RuntimeError("ToyEnv stepped before its first reset")
        if self._fail == "raise":
            self._fail = None
            raise ValueError("toy env failure on purpose")
        if self._fail == "exit":
            os._exit(7)
        self._t += 1
        success = bool(action[6] > 0.5)
        reward = 1.0 if success else 0.1
        return self._obs(float(action[0])), reward, success, False, {"success": success}

    def fail_next_step(self, how: str) -> None:
        """Make the next ``step`` raise (``"raise"``) or kill the process (``"exit"``)."""
        self._fail = how


class ReachToyEnv(ToyEnv):
    """ToyEnv with one progress flag: ``reached`` at each step where the action's x dim > 0.5."""

    progress_flags = ("reached",)

    def step(self, action):
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, {**info, "reached": bool(action[0] > 0.5)}


def make_toy_vector_env(num_envs: int = 1, max_episode_steps: int = 10, pool: bool = False, **contract_kwargs):
    """A registry factory for ToyEnv (serial, or a process pool with ``pool=True``)."""
    import functools

    from vla_envs.core import ChunkVectorEnv
    from vla_envs.core.pool import ProcessPoolBackend
    from vla_envs.core.serial import SerialBackend

    fns = [functools.partial(ToyEnv, max_episode_steps)] * num_envs
    backend = ProcessPoolBackend(fns) if pool else SerialBackend(fns)
    return ChunkVectorEnv(backend, **contract_kwargs)


class BanditEnv(TaskEnv):
    """A one-state task whose every step pays ``0.1 * action[1]`` (the y translation, in
    [-1, 1]): a policy that learns anything learns to move in +y. The image is a constant grey
    at the model's size, so nothing but the reward says what to do."""

    metadata = {"render_modes": []}
    num_initial_states = 1000

    def __init__(self, max_episode_steps: int = 16, size: int = 64):
        self.max_episode_steps = max_episode_steps
        self.size = size
        self.observation_space = make_observation_space((size, size), state_dim=3)
        self.action_space = make_action_space()

    def _obs(self):
        return {"image": np.full((self.size, self.size, 3), 100, np.uint8), "state": np.zeros(3, np.float32),
                "instruction": "move to the left"}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.state_id_from(seed, options)
        return self._obs(), {}

    def step(self, action):
        return self._obs(), 0.1 * float(action[1]), False, False, {"success": False}


def make_toy_cli_env(num_envs: int = 1, image_size: int | None = None, **kwargs):
    """``make_toy_vector_env`` for ``vla-envs`` commands, which pass ``image_size`` (the toy's is fixed)."""
    return make_toy_vector_env(num_envs, **kwargs)


def make_bandit_vector_env(num_envs: int = 1, image_size: int | tuple[int, int] = 64, max_episode_steps: int = 16,
                           vectorization: str = "serial", first_env_index: int = 0, **contract_kwargs):
    """A registry factory for BanditEnv, accepting the trainer's ``make_env`` arguments (always serial)."""
    import functools

    from vla_envs.core import ChunkVectorEnv
    from vla_envs.core.serial import SerialBackend

    size = image_size if isinstance(image_size, int) else image_size[0]
    return ChunkVectorEnv(SerialBackend([functools.partial(BanditEnv, max_episode_steps, size)] * num_envs),
                          **contract_kwargs)
