"""Build a ``ChunkVectorEnv`` over a ManiSkill task, picking the physics backend."""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from vla_envs.core.vector_env import ChunkVectorEnv

SIM_BACKENDS = ("auto", "physx_cpu", "physx_cuda")
VECTORIZATIONS = ("pool", "serial", "batched")


def resolve_sim_backend(sim_backend: str) -> str:
    """``"auto"`` picks ManiSkill's GPU-batched PhysX when CUDA is available, else CPU PhysX."""
    if sim_backend not in SIM_BACKENDS:
        raise ValueError(f"sim_backend={sim_backend!r}; allowed: {list(SIM_BACKENDS)}")
    if sim_backend != "auto":
        return sim_backend
    import torch

    return "physx_cuda" if torch.cuda.is_available() else "physx_cpu"


RENDER_BACKENDS = ("auto", "cpu", "gpu")


def resolve_render_backend(render_backend: str, cuda_available: bool | None = None) -> str:
    """SAPIEN's render device. ``"auto"``: the GPU's Vulkan driver (``"gpu"``) on a machine with a
    CUDA GPU, whatever the physics backend (a GPU node rarely has Mesa's software Vulkan, lavapipe),
    else the CPU's (``"cpu"``, lavapipe). ``cuda_available`` None: ask torch."""
    if render_backend not in RENDER_BACKENDS:
        raise ValueError(f"render_backend={render_backend!r}; allowed: {list(RENDER_BACKENDS)}")
    if render_backend != "auto":
        return render_backend
    if cuda_available is None:
        import torch

        cuda_available = torch.cuda.is_available()
    return "gpu" if cuda_available else "cpu"


def make_maniskill_vector_env(task: str, instruction: str | None, num_envs: int = 1, *,
                              sim_backend: str = "auto", vectorization: str = "pool", render_backend: str = "auto",
                              image_size: int | tuple[int, int] | None = 128,
                              reward_mode: str = "normalized_dense", obs_mode: str = "rgb",
                              register_module: str | None = None,
                              env_kwargs: dict[str, Any] | None = None,
                              **contract_kwargs: Any) -> ChunkVectorEnv:
    """A ManiSkill task as the project's vector env.

    Args:
        task: ManiSkill env id.
        instruction: language instruction of every episode (None: the task's own).
        num_envs: batch size.
        sim_backend: ``"auto"``, ``"physx_cpu"`` (one env per worker process) or
            ``"physx_cuda"`` (all envs in this process, GPU-batched).
        vectorization: CPU physics: ``"pool"`` (worker processes, shared memory), ``"serial"``
            (this process; for debugging) or ``"batched"`` (one ManiSkill batch in this process,
            the code path ``physx_cuda`` always takes; on CPU physics only with ``num_envs=1``,
            which runs that path where there is no GPU).
        render_backend: ``"auto"`` (``resolve_render_backend``), ``"cpu"`` or ``"gpu"``.
        image_size: camera side in pixels, or (height, width); None: the task's cameras.
        reward_mode: ManiSkill reward mode.
        obs_mode: ManiSkill observation mode (an rgb mode).
        register_module: module that registers ``task`` with ManiSkill when imported.
        env_kwargs: extra arguments for ManiSkill's ``gym.make``.
        **contract_kwargs: ``ChunkVectorEnv`` options (auto_reset, ignore_terminations, ...).
    """
    from vla_envs.backends.maniskill.common import check_assets, import_maniskill

    if not isinstance(num_envs, int) or num_envs < 1:
        raise ValueError(f"num_envs={num_envs!r} must be a positive integer")
    if vectorization not in VECTORIZATIONS:
        raise ValueError(f"vectorization={vectorization!r}; allowed: {list(VECTORIZATIONS)}")
    image_hw = (image_size, image_size) if isinstance(image_size, int) else (
        tuple(image_size) if isinstance(image_size, (tuple, list)) else image_size)
    if image_hw is not None and not (isinstance(image_hw, tuple) and len(image_hw) == 2 and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= 1 for v in image_hw)):
        raise ValueError(f"image_size={image_size!r}: a side in pixels or (height, width), each an integer >= 1 "
                         "(None: the task's cameras)")
    backend_name = resolve_sim_backend(sim_backend)
    render = resolve_render_backend(render_backend)
    import_maniskill()  # fail here, with the install command, not inside a worker
    if register_module:
        import importlib

        importlib.import_module(register_module)
    check_assets(task)
    env_kwargs = dict(env_kwargs or {}, render_backend=render)
    if backend_name == "physx_cuda" or vectorization == "batched":
        from vla_envs.backends.maniskill.gpu import ManiSkillGPUBackend
        from vla_envs.backends.maniskill.physx import check_physx_library

        if backend_name == "physx_cuda":
            check_physx_library()  # never let SAPIEN download it inside the env (offline nodes, races)
        backend = ManiSkillGPUBackend(task, instruction, num_envs, image_hw, reward_mode, obs_mode,
                                      register_module, sim_backend=backend_name, **env_kwargs)
        if contract_kwargs.get("use_fixed_reset_state_ids") and not backend.ids_fix_states:
            backend.close()
            raise ValueError(
                f"{task} on a GPU batch cannot give envs with the same initial-state id the same initial "
                "state (ManiSkill seeds a reset's draws from its first env only), which "
                "use_fixed_reset_state_ids (GRPO's groups) needs: use CPU physics (sim_backend='physx_cpu') "
                "or a task that decodes its ids (PutOnPlateInScene25*)")
    else:
        from vla_envs.backends.maniskill.task_env import ManiSkillTaskEnv
        from vla_envs.core.pool import ProcessPoolBackend
        from vla_envs.core.serial import SerialBackend

        fn = functools.partial(ManiSkillTaskEnv, task, instruction, image_hw, reward_mode, obs_mode,
                               register_module, **env_kwargs)
        # a crashed or hung simulator worker is replaced and its episode truncated, as for LIBERO
        backend = (ProcessPoolBackend([fn] * num_envs, restart_crashed=True) if vectorization == "pool"
                   else SerialBackend([fn] * num_envs))
    return ChunkVectorEnv(backend, **contract_kwargs)


def assets_status(spec: Any) -> str:
    """For ``vla-envs list``: whether a registered ManiSkill task's assets are on disk."""
    from vla_envs.backends.maniskill.common import missing_assets

    return "missing" if missing_assets(spec.kwargs["task"]) else "present"
