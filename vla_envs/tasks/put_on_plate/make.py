"""Build PutOnPlateInScene25 vector envs (the registry's factory for this family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vla_envs.core.vector_env import ChunkVectorEnv
from vla_envs.tasks.put_on_plate.options import PutOnPlateOptions

TASK_ID = "VLA-PutOnPlateInScene25-v1"


def make_put_on_plate_vector_env(num_envs: int = 1, *, variant: str = "PutOnPlateInScene25Main-v3",
                                 sim_backend: str = "auto", vectorization: str = "pool",
                                 render_backend: str = "auto", **kwargs: Any) -> ChunkVectorEnv:
    """PutOnPlateInScene25 as the project's vector env.

    Args:
        num_envs: batch size.
        variant: the env id of the condition (``variants.VARIANTS``): Main (train split:
            objects 0-15, photos 0-15), MainTest (objects 16-24, photos 16-20), or an OOD one.
        sim_backend, vectorization, render_backend: as for every ManiSkill env
            (``make_maniskill_vector_env``).
        **kwargs: the task's options (``options.PutOnPlateOptions``: assets, image_size,
            camera_crop, low_poly, ...) and ``ChunkVectorEnv``'s (auto_reset, time_limit, ...);
            any other name is refused with close matches, before any work.
    """
    from vla_envs.backends.maniskill import make_maniskill_vector_env
    from vla_envs.tasks.put_on_plate.assets import resolve_pack
    from vla_envs.tasks.put_on_plate.variants import get_variant

    options, contract_kwargs = PutOnPlateOptions.split(kwargs, where=f"{variant}: ")
    spec = get_variant(variant)  # unknown variant: error listing the valid ones, before any work
    options.check_camera()
    pack = resolve_pack(options.assets, Path(options.asset_root) if options.asset_root else None)
    if spec.objects.stop > len(pack.objects):
        raise ValueError(f"{variant} needs {spec.objects.stop} objects; the {pack.kind} pack has {len(pack.objects)}")
    spec.split(len(pack.plates))  # refuses a variant that needs more plates than the pack has
    env = make_maniskill_vector_env(
        TASK_ID, None, num_envs, sim_backend=sim_backend, vectorization=vectorization,
        render_backend=render_backend, image_size=None, reward_mode=options.reward_mode,
        obs_mode="rgb+segmentation", register_module="vla_envs.tasks.put_on_plate.env",
        env_kwargs=dict(pack=pack, variant=variant, camera_file=options.camera_file, camera_hw=options.image_hw,
                        camera_crop=options.camera_crop, native_render=options.native_render,
                        robot_uids="panda_lowpoly" if options.low_poly else "panda", sim_freq=options.sim_freq,
                        reward_shaping=options.reward_shaping, expert_start_phases=options.expert_start_phases),
        **contract_kwargs)
    env.asset_pack = pack.kind  # recorded by eval reports and checkpoints
    env.variant = spec
    return env


def assets_status(spec: Any) -> str:
    """For ``vla-envs list`` and ``doctor``: which pack ``assets="auto"`` would use, or the error an
    official pack that does not load gives (``auto`` picks it whenever its folder exists)."""
    from vla_envs.tasks.put_on_plate.assets import asset_root, load_pack

    official = asset_root() / "official"
    if (official / "carrot").is_dir():
        try:
            load_pack(official, "official")
        except (OSError, ValueError) as e:
            return f"error: the official pack does not load: {e}"
        return "official"
    return "procedural (official not found)"
