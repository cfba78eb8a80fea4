"""The env contract shared by every backend (see ``vector_env.ChunkVectorEnv``)."""

from vla_envs.core.backend import BatchedBackend, StepResult
from vla_envs.core.spaces import ACTION_DIM, make_action_space, make_observation_space
from vla_envs.core.vector_env import ChunkStepResult, ChunkVectorEnv

__all__ = [
    "ACTION_DIM",
    "BatchedBackend",
    "ChunkStepResult",
    "ChunkVectorEnv",
    "StepResult",
    "make_action_space",
    "make_observation_space",
]
