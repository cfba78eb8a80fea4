"""Chunk-aware vectorized Gymnasium envs for RL fine-tuning of VLA policies.

``import vla_envs`` registers every task id with Gymnasium::

    import gymnasium as gym
    import vla_envs  # noqa: F401

    env = gym.make("vla/PickCube-v1", num_envs=4)
    obs, info = env.reset(seed=0)

See ``vla_envs.core.vector_env.ChunkVectorEnv`` for the contract every env follows.
"""

from vla_envs.core import ChunkStepResult, ChunkVectorEnv
from vla_envs.registry import TASKS, get_task, register_all

register_all()

__all__ = ["TASKS", "ChunkStepResult", "ChunkVectorEnv", "get_task", "register_all"]
