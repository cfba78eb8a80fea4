"""What the CPU and GPU ManiSkill backends share: imports, env construction, obs/action
conversion to the project's convention."""

from __future__ import annotations

from typing import Any

import numpy as np

from vla_envs.errors import BackendNotInstalledError

INSTALL_HINT = "bash scripts/setup.sh maniskill   (or: pip install 'vla-rl[maniskill]')"
VULKAN_HINT = (
    "SAPIEN (ManiSkill's renderer) found no usable Vulkan device. On Debian 12 install a "
    "lavapipe from Mesa >= 23 as root: add the bookworm-backports source, then "
    "`apt-get install -t bookworm-backports mesa-vulkan-drivers libvulkan1` "
    "(scripts/setup.sh does this when run as root); on a GPU node, the driver's Vulkan ICD. "
    "`vla-envs doctor` checks every piece."
)
# Panda's "pd_ee_delta_pose" scales normalised actions to +/-0.1 m and +/-0.1 rad.
CONTROL_MODE = "pd_ee_delta_pose"


def import_maniskill() -> Any:
    """Import ``mani_skill.envs`` (registers ManiSkill's tasks) or explain how to install it."""
    try:
        import mani_skill.envs  # noqa: F401
        import mani_skill
    except ImportError as e:
        raise BackendNotInstalledError(
            f"the ManiSkill backend needs mani_skill ({e}); install it with: {INSTALL_HINT}"
        ) from e
    return mani_skill


def make_maniskill_env(task: str, num_envs: int, sim_backend: str, image_hw: tuple[int, int] | None,
                       reward_mode: str, obs_mode: str = "rgb", register_module: str | None = None,
                       render_backend: str = "cpu", **kwargs: Any):
    """Build a ManiSkill env whose own time limit never fires (ours is in ChunkVectorEnv).

    ``image_hw`` resizes every sensor (None: the task sizes its cameras itself);
    ``register_module`` is imported first when it registers ``task`` with ManiSkill."""
    import importlib

    import gymnasium as gym

    import_maniskill()
    if register_module:
        importlib.import_module(register_module)
    make_kwargs: dict[str, Any] = dict(
        obs_mode=obs_mode, control_mode=CONTROL_MODE, reward_mode=reward_mode,
        num_envs=num_envs, sim_backend=sim_backend,
        render_backend=render_backend,
        max_episode_steps=2**30, **kwargs,
    )
    if image_hw is not None:
        make_kwargs["sensor_configs"] = dict(width=image_hw[1], height=image_hw[0])
    try:
        return gym.make(task, **make_kwargs)
    except RuntimeError as e:
        text = str(e).lower()
        if "vulkan" in text or "physical device" in text:
            raise BackendNotInstalledError(f"{VULKAN_HINT}\n(original error: {e})") from e
        raise


def missing_assets(task: str) -> list[str]:
    """ManiSkill data-source ids that ``task`` needs and that are not on disk.

    ManiSkill itself would prompt (y/n) for them, and on "n" or no stdin exit with code 0 or
    raise EOFError; we check first so that never happens.
    """
    from mani_skill.utils import assets
    from mani_skill.utils.registration import REGISTERED_ENVS

    import_maniskill()
    if task not in REGISTERED_ENVS:
        raise ValueError(f"ManiSkill has no task {task!r}")
    missing = []
    for asset_id in REGISTERED_ENVS[task].asset_download_ids or []:
        ids = (assets.expand_data_group_into_individual_data_source_ids(asset_id)
               if asset_id in assets.DATA_GROUPS else [asset_id])
        missing += [i for i in ids if not assets.is_data_source_downloaded(i)]
    return missing


def check_assets(task: str) -> None:
    """Raise ``AssetsMissingError`` naming the download command if ``task`` lacks assets."""
    missing = missing_assets(task)
    if missing:
        import mani_skill

        from vla_envs.errors import AssetsMissingError

        shown = " ".join(missing[:5]) + (f" (and {len(missing) - 5} more)" if len(missing) > 5 else "")
        raise AssetsMissingError(
            f"ManiSkill task {task} needs assets that are not under {mani_skill.ASSET_DIR} "
            f"(set MS_ASSET_DIR to use another folder): {shown}. On a machine with internet run: "
            f"python -m mani_skill.utils.download_asset {task}"
        )


SEED_SPACE = 2**31 - 1


def episode_space(env: Any) -> int:
    """How many initial-state ids ``env`` has: its ``num_episodes`` when it indexes episodes,
    else the ManiSkill seed space (the id is the episode seed)."""
    return int(getattr(env, "num_episodes", SEED_SPACE))


def reset_kwargs(env: Any, state_ids: list[int]) -> dict[str, Any]:
    """``reset`` arguments that put ``env``'s envs in initial states ``state_ids``."""
    ids = [int(s) for s in state_ids]
    if hasattr(env, "num_episodes"):
        return {"seed": ids, "options": {"episode_id": ids}}
    return {"seed": ids if len(ids) > 1 else ids[0]}


def registered_max_steps(task: str, register_module: str | None = None) -> int:
    """The time limit ManiSkill registers for ``task``."""
    import importlib

    from mani_skill.utils.registration import REGISTERED_ENVS

    import_maniskill()
    if register_module:
        importlib.import_module(register_module)
    spec = REGISTERED_ENVS[task]
    return int(spec.max_episode_steps or 100)


def to_numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


# our progress flag -> the key ManiSkill tasks' evaluate() reports it under
PROGRESS_INFO_KEYS = {"grasped": "is_grasped"}


def progress_flags(info: dict[str, Any]) -> tuple[str, ...]:
    """The progress flags a task reports, read from a reset's or step's ``info``."""
    return tuple(name for name, key in PROGRESS_INFO_KEYS.items() if key in info)


def progress_values(info: dict[str, Any], flags: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each flag's bool ``[B]`` from a batched step's ``info``."""
    return {name: to_numpy(info[PROGRESS_INFO_KEYS[name]]).reshape(-1).astype(bool) for name in flags}


def convert_obs(raw: dict[str, Any]) -> dict[str, np.ndarray]:
    """ManiSkill's batched rgb observation -> ``image`` uint8 [B, H, W, 3] and
    ``state`` float32 [B, S] = (robot qpos, TCP pose as xyz + wxyz quaternion, then the goal
    position where the task's rgb observation has one: PickCube's target, which its cameras do not
    show, and PullCube's)."""
    cameras = raw["sensor_data"]
    first = next(iter(cameras))
    image = to_numpy(cameras[first]["rgb"])[..., :3].astype(np.uint8, copy=False)
    parts = [to_numpy(raw["agent"]["qpos"])]
    extra = raw.get("extra", {})
    for key in ("tcp_pose", "goal_pos"):  # without goal_pos a PickCube policy could not know where to go
        if key in extra:
            parts.append(to_numpy(extra[key]))
    state = np.concatenate(parts, axis=-1).astype(np.float32, copy=False)
    return {"image": image, "state": state}


def to_maniskill_action(actions: np.ndarray) -> np.ndarray:
    """Ours: gripper -1 open / +1 close. ManiSkill's Panda: -1 closed / +1 open."""
    out = np.array(actions, dtype=np.float32, copy=True)
    out[..., -1] = -out[..., -1]
    return out
