"""Build a ``ChunkVectorEnv`` over a LIBERO task group: one ``LiberoTaskEnv`` per worker process."""

from __future__ import annotations

import functools
from typing import Any

from vla_envs.backends.libero.options import LiberoOptions
from vla_envs.core.vector_env import ChunkVectorEnv

VECTORIZATIONS = ("pool", "serial")


def make_libero_vector_env(group: str, num_envs: int = 1, *, vectorization: str = "pool",
                           **kwargs: Any) -> ChunkVectorEnv:
    """A LIBERO suite (or LIBERO-130) as the project's vector env.

    Args:
        group: ``libero_spatial``, ``libero_object``, ``libero_goal``, ``libero_10``,
            ``libero_90`` or ``libero_130``.
        num_envs: batch size; each env runs in its own worker process (``vectorization="pool"``;
            ``"serial"``: all in this process, for debugging).
        **kwargs: the task's options (``options.LiberoOptions``: image_size, wrist,
            settle_steps, fast_render) and ``ChunkVectorEnv``'s (auto_reset, ignore_terminations,
            use_fixed_reset_state_ids, group_size, time_limit, ...); any other name is refused.

    Initial-state ids are ``task_index * 50 + init_index`` over the group's tasks, so drawing ids
    samples tasks uniformly across the suites; ``env.tasks`` lists them.
    """
    from vla_envs.backends.libero.rendering import ensure_gl
    from vla_envs.backends.libero.suites import GROUPS, group_tasks
    from vla_envs.backends.libero.task_env import LiberoTaskEnv
    from vla_envs.core.pool import ProcessPoolBackend
    from vla_envs.core.serial import SerialBackend

    if group not in GROUPS:
        raise ValueError(f"unknown LIBERO task group {group!r}; valid: {', '.join(GROUPS)}")
    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r} must be a positive integer")
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization={vectorization!r}; allowed: {list(VECTORIZATIONS)}")
    options, contract_kwargs = LiberoOptions.split(kwargs, where=f"{group}: ")
    ensure_gl()  # here, once, with a clear error; the workers inherit MUJOCO_GL
    fn = functools.partial(LiberoTaskEnv, group, options.image_size, options.wrist, options.settle_steps,
                           options.fast_render)
    # a crashed simulator (MuJoCo can abort the process) is replaced and its episode truncated
    backend = (ProcessPoolBackend([fn] * num_envs, restart_crashed=True) if vectorization == "pool"
               else SerialBackend([fn] * num_envs))
    env = ChunkVectorEnv(backend, **contract_kwargs)
    env.tasks = group_tasks(group)
    return env
