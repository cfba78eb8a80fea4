"""ManiSkill 3 backend: CPU PhysX in a worker pool here, GPU-batched PhysX on CUDA."""

from vla_envs.backends.maniskill.make import make_maniskill_vector_env

__all__ = ["make_maniskill_vector_env"]
