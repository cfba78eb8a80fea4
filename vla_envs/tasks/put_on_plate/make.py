"""Build PutOnPlateInScene25 vector envs (the registry's factory for this family)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from vla_envs.core.vector_env import ChunkVectorEnv

ROBOTS = ("panda",)
CONTROL_FREQ = 5  # Hz, the reference's
REFERENCE_SIM_FREQ = 500
REWARD_MODES = ("dense", "sparse", "none")  # ManiSkill's names; "none": reward 0
TASK_ID = "VLA-PutOnPlateInScene25-v1"


def make_put_on_plate_vector_env(num_envs: int = 1, *, variant: str = "PutOnPlateInScene25Main-v3",
                                 assets: str = "auto",
                                 robot: str = "panda", low_poly: bool = False,
                                 sim_freq: int = REFERENCE_SIM_FREQ,
                                 camera_file: str | Path | None = None,
                                 image_size: int | tuple[int, int] = (480, 640),
                                 camera_crop: tuple[int, int, int, int] | None = None,
                                 reward_shaping: float = 0.0, reward_mode: str = "dense",
                                 expert_start_phases: Sequence[str] = (),
                                 sim_backend: str = "auto", vectorization: str = "pool",
                                 render_backend: str = "auto", asset_root: str | Path | None = None,
                                 **contract_kwargs: Any) -> ChunkVectorEnv:
    """PutOnPlateInScene25 as the project's vector env.

    Args:
        num_envs: batch size.
        variant: the env id of the condition (``variants.VARIANTS``): Main (train split:
            objects 0-15, photos 0-15), MainTest (objects 16-24, photos 16-20), or an OOD one.
        assets: ``"auto"``, ``"official"`` or ``"procedural"`` (see ``assets.resolve_pack``).
        robot: ``"panda"`` (our Franka's twin; WidowX needs the official robot assets).
        low_poly: render the Panda with its collision meshes (4-8x faster on CPU). Training
            only: evaluation must use the default.
        sim_freq: physics steps per second; a multiple of the 5 Hz control frequency. 500 (the
            reference's) takes 100 sub-steps per control step; 100 takes 20, about 2x the
            env-steps/s in one process, at some cost in grasp fidelity (the scripted expert's
            success falls from 0.98 to 0.92, ``docs/benchmarks.md``). Training only, like
            ``low_poly``: evaluation must use the default.
        camera_file: the calibration tool's camera file (default: the packaged one).
        image_size: main camera side, or (height, width); intrinsics scale with it.
        camera_crop: ``(left, top, right, bottom)`` in the camera file's pixels: the policy sees
            only this region, resized to ``image_size`` (None: the whole view). Rendered as a
            pinhole camera of its own, so it costs nothing; apply the same crop to the real
            camera's frames.
        reward_shaping: weight of a reach-and-place term added to the reference's dense reward
            (``rewards.shaping_potential``, differenced like it): up to ``reward_shaping`` for
            bringing the gripper to the object, as much again for bringing the object to the
            plate. 0 (default): the reference's reward. Training only; success is unchanged.
        reward_mode: ``"dense"`` (default): the reference's staged reward (0.1 for the first
            grasp, 0.1 for holding it 5 steps, 1.0 for success), differenced per step.
            ``"sparse"``: 1 while successful after a grasp, nothing for grasping (returns
            rank only placements). ``"none"``: 0. Training only; success is unchanged.
        expert_start_phases: start each episode where the scripted expert, run from the
            episode's initial state, enters one of these phases (``expert.PHASES``: ``"above"``
            is the episode's own start, ``"lift"`` just grasped, ``"carry"`` lifted, ``"lower"``
            over the plate, ``"open"`` lowered onto it), drawn per episode id (so GRPO groups
            share it); the time limit counts from there. E.g. ``["above", "lift", "carry",
            "lower"]``: a quarter of the episodes each. Empty (default): every episode starts at
            its initial state. Training only: evaluation must start at the initial state. Needs
            whole-batch resets on the GPU backend (``auto_reset=False``).
        sim_backend, vectorization, render_backend: as for every ManiSkill env.
        asset_root: where packs live (default ``$VLA_ENVS_ASSET_DIR``).
        **contract_kwargs: ``ChunkVectorEnv`` options.
    """
    from vla_envs.backends.maniskill import make_maniskill_vector_env
    from vla_envs.tasks.put_on_plate.assets import resolve_pack
    from vla_envs.tasks.put_on_plate.camera import load_camera_file
    from vla_envs.tasks.put_on_plate.variants import get_variant

    if robot not in ROBOTS:
        raise ValueError(f"robot={robot!r}; available here: {list(ROBOTS)}")
    if isinstance(sim_freq, bool) or not isinstance(sim_freq, int) or sim_freq < CONTROL_FREQ \
            or sim_freq % CONTROL_FREQ:
        raise ValueError(f"sim_freq={sim_freq!r}; must be a positive multiple of the {CONTROL_FREQ} Hz control "
                         f"frequency, e.g. {REFERENCE_SIM_FREQ} (the reference's) or 100")
    if isinstance(reward_shaping, bool) or not isinstance(reward_shaping, (int, float)) \
            or not 0 <= reward_shaping < float("inf"):
        raise ValueError(f"reward_shaping={reward_shaping!r}; must be a number >= 0 (0: the reference's reward, "
                         f"e.g. 0.1: up to 0.1 for the reach and 0.1 for the place)")
    if reward_mode not in REWARD_MODES:
        raise ValueError(f"reward_mode={reward_mode!r}; must be one of {list(REWARD_MODES)}")
    if reward_mode != "dense" and reward_shaping:
        raise ValueError(f"reward_shaping={reward_shaping!r} with reward_mode={reward_mode!r}: the shaping is part of "
                         f"the dense reward; use reward_mode='dense' or reward_shaping=0")
    from vla_envs.tasks.put_on_plate.expert import PHASES

    if isinstance(expert_start_phases, str) or not isinstance(expert_start_phases, Sequence) \
            or not all(p in PHASES for p in expert_start_phases):
        raise ValueError(f"expert_start_phases={expert_start_phases!r}; must be a list of the scripted expert's "
                         f"phases {list(PHASES)} (e.g. ['above', 'lift', 'carry', 'lower']), or empty")
    spec = get_variant(variant)  # unknown variant: error listing the valid ones, before any work
    # bad camera file or crop: error naming the field, before any work
    load_camera_file(camera_file).check_crop(camera_crop)
    pack = resolve_pack(assets, Path(asset_root) if asset_root else None)
    needed = max(spec.plates.stop, 2 if spec.distractor == "plate" else 0)
    if needed > len(pack.plates) or spec.objects.stop > len(pack.objects):
        raise ValueError(f"{variant} needs {needed} plates and {spec.objects.stop} objects; the "
                         f"{pack.kind} pack has {len(pack.plates)} and {len(pack.objects)}")
    image_hw = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
    env = make_maniskill_vector_env(
        TASK_ID, None, num_envs, sim_backend=sim_backend, vectorization=vectorization,
        render_backend=render_backend, image_size=None, reward_mode=reward_mode, obs_mode="rgb+segmentation",
        register_module="vla_envs.tasks.put_on_plate.env",
        env_kwargs=dict(pack=pack, variant=variant, camera_file=camera_file,
                        camera_hw=image_hw, camera_crop=camera_crop, robot_uids="panda_lowpoly" if low_poly else "panda",
                        sim_freq=sim_freq, reward_shaping=float(reward_shaping),
                        expert_start_phases=tuple(expert_start_phases)),
        **contract_kwargs)
    env.asset_pack = pack.kind  # recorded by eval reports and checkpoints
    env.variant = spec
    return env


def assets_status(spec: Any) -> str:
    """For ``vla-envs list``: which pack ``assets="auto"`` would use."""
    from vla_envs.tasks.put_on_plate.assets import asset_root

    if (asset_root() / "official" / "carrot").is_dir():
        return "official"
    return "procedural (official not found)"
