"""Demonstrations as supervised samples: one sample per step of every demo episode.

``build_samples`` pairs each step's observation (image, state, instruction) with the target action
chunk ``actions[t : t + C]`` (``C`` = the model's ``chunk_size``, 1 for OpenVLA), padded at the end
of the episode by repeating the last action. The demo folders are ``vla_envs.demos``'s format.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vla_envs.demos import load_demos, load_index

from .scene import scene_targets


@dataclass
class SFTSamples:
    """Training samples of a demo folder.

    Shapes:
        image: uint8 ``[M, H, W, 3]`` (at the model's image size after ``resize_images``).
        state: float32 ``[M, S]`` robot state (read by a model with ``proprio_dim = S``).
        instruction: ``M`` strings.
        action_chunk: float32 ``[M, C, 7]`` env actions ``actions[t : t + C]``, end-padded.
        scene: float32 ``[M, 5 K]`` scene targets (``data.scene.scene_targets``) of demos that record
            the expert's poses, else None.
        episode_step: int ``[M]``, each sample's step in its episode (0: the episode's first frame;
            a correction's recorded part starts at its ``handover_step``).
        holds_release: bool ``[M]``, True where the sample's action chunk holds the step at which
            the gripper first opens after closing (the release of a pick and place).
    """

    image: np.ndarray
    state: np.ndarray
    instruction: list[str]
    action_chunk: np.ndarray
    scene: np.ndarray | None = None
    episode_step: np.ndarray | None = None
    holds_release: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.instruction)

    def obs(self, idx: np.ndarray) -> dict:
        """The observation dict (as vla_envs returns it) of samples ``idx``."""
        return {
            "image": self.image[idx],
            "state": self.state[idx],
            "instruction": tuple(self.instruction[i] for i in idx),
        }


def action_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """``[T, A]`` -> ``[T, C, A]`` with row ``t`` = ``actions[t : t + C]``, the last action repeated."""
    T = len(actions)
    idx = np.minimum(np.arange(T)[:, None] + np.arange(chunk_size)[None, :], T - 1)
    return actions[idx].astype(np.float32)


def release_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """bool ``[T]``: True at steps ``t`` whose chunk ``actions[t : t + C]`` holds the release, the
    first step at which the gripper opens (action 6 <= 0) after it was closed (> 0). All False
    when the episode never releases."""
    closed = actions[:, 6] > 0
    opens = np.flatnonzero(~closed[1:] & closed[:-1]) + 1
    holds = np.zeros(len(actions), bool)
    if len(opens):
        holds[max(0, opens[0] - chunk_size + 1) : opens[0] + 1] = True
    return holds


DemoFolders = str | Path | Sequence[str | Path]


def demo_folders(demo_dirs: DemoFolders) -> list[str | Path]:
    """One demo folder, or several, as a list in the order given."""
    return [demo_dirs] if isinstance(demo_dirs, (str, Path)) else list(demo_dirs)


def load_episodes(demo_dirs: DemoFolders, only_success: bool = False) -> list[dict[str, np.ndarray]]:
    """The episodes of one demo folder, or of several in the order given; with ``only_success``,
    those whose index entry records ``success_once`` (recordings of the real robot, and demos
    collected with ``--all``, hold failed episodes too). Episodes a dry run recorded (``franka-eval
    --dry-run``: actions never executed, images of an arm that did not move) are left out, with a
    warning. A correction episode (``vla-train collect-corrections``: its recorded part starts at the
    hand-over) carries its ``handover_step`` as ``first_step``."""
    episodes = []
    for folder in demo_folders(demo_dirs):
        index, arrays = load_demos(folder)
        entries = index.get("episodes", [])
        dry = sum(bool(entry.get("dry_run")) for entry in entries)
        if dry:
            warnings.warn(f"{folder}: {dry} of {len(entries)} episodes were recorded in a dry run (nothing moved); "
                          "left out", stacklevel=2)
        kept = [(entry, e) for entry, e in zip(entries, arrays) if not entry.get("dry_run")
                and (not only_success or float(entry.get("success_once", 1.0)) > 0.5)]
        episodes += [{**e, "first_step": int(entry["handover_step"])} if "handover_step" in entry else e
                     for entry, e in kept]
    return episodes


def scene_options(env_kwargs: dict) -> dict:
    """The options of a demo folder's env that decide what its images show (``camera_crop``,
    ``camera_file``, assets, variant, ...): without the vector env's contract (``auto_reset``,
    ``time_limit``, ...) and how the env ran (``image_size``: demos are resized to the model's;
    ``vectorization``, the simulation and render backends)."""
    from vla_envs.core.options import contract_options

    how = {*contract_options(), "image_size", "vectorization", "sim_backend", "render_backend"}
    return {k: v for k, v in env_kwargs.items() if k not in how}


def demos_env(demo_dirs: DemoFolders) -> dict:
    """``{"env_id", "env_kwargs"}``: the env the demos were recorded in, when every folder records
    the same (else None), and the scene options (``scene_options``) every folder records alike:
    simulated demos and real episodes share their ``camera_crop`` though only the simulated ones
    name their assets. Options the folders record differently are named in a warning and left out
    (another crop: the model's view is then not recorded, and serving needs it given); None when a
    folder records none."""
    folders = demo_folders(demo_dirs)
    indexes = [load_index(folder) for folder in folders]
    ids = [index.get("env_id") for index in indexes]
    scenes = [scene_options(k) if isinstance(k := index.get("env_kwargs"), dict) else None for index in indexes]
    if all(s is not None for s in scenes) and any(s != scenes[0] for s in scenes):
        differ = sorted({key for s in scenes for key in {*s, *scenes[0]} if s.get(key) != scenes[0].get(key)})
        warnings.warn(f"the demo folders were recorded with other scene options ({', '.join(differ)}: "
                      + "; ".join(f"{folder}: {[s.get(key) for key in differ]}" for folder, s in zip(folders, scenes))
                      + "); those are not recorded with the model, so give serving its camera_crop / camera_file "
                      "if they are among them", stacklevel=2)
    same = lambda found, kind: (found[0] if found and isinstance(found[0], kind)  # noqa: E731
                                and all(f == found[0] for f in found) else None)
    shared = None
    if scenes and all(s is not None for s in scenes):
        shared = {k: v for k, v in scenes[0].items() if all(k in s and s[k] == v for s in scenes)}
    return {"env_id": same(ids, str), "env_kwargs": shared}


ACTION_DIM = 7
"""The demos' actions: delta xyz, delta rotation, gripper (the models' action space)."""


def trained_episodes(demo_dirs: DemoFolders) -> list[dict[str, np.ndarray]]:
    """The episodes supervised training learns from: the successful ones with steps, with 7-D actions.

    Raises:
        FileNotFoundError / ValueError: not a demo folder, no successful episode with steps, or actions
            of another width (demos of another env).
    """
    episodes = [e for e in load_episodes(demo_dirs, only_success=True) if len(e["action"]) > 0]
    if not episodes:
        raise ValueError(f"{demo_dirs}: the demo folder holds no successful episodes with steps (failed ones, which "
                         f"recordings of the real robot keep, are not trained on)")
    widths = sorted({int(np.shape(e["action"])[-1]) for e in episodes})
    if widths != [ACTION_DIM]:
        raise ValueError(f"{demo_dirs}: actions of width {widths}; the models take {ACTION_DIM}-D actions (delta "
                         "xyz, delta rotation, gripper): demos of another env?")
    return episodes


def build_samples(demo_dir: DemoFolders, chunk_size: int, image_size: int | None = None) -> SFTSamples:
    """One sample per step of every successful episode in ``demo_dir`` (one folder or several;
    see ``vla_envs.demos``): behaviour cloning copies what succeeded, never a failure. Images at
    ``image_size`` (the model's; see ``stack_images``).

    Raises:
        FileNotFoundError / ValueError: not a demo folder, or it holds no successful steps.
    """
    episodes = trained_episodes(demo_dir)
    return SFTSamples(
        image=stack_images(episodes, image_size),
        state=np.concatenate([e["state"] for e in episodes]).astype(np.float32),
        instruction=[str(e["instruction"]) for e in episodes for _ in range(len(e["action"]))],
        action_chunk=np.concatenate([action_chunks(e["action"], chunk_size) for e in episodes]),
        scene=(np.concatenate([scene_targets(e["scene"]) for e in episodes])
               if all("scene" in e for e in episodes) else None),
        episode_step=np.concatenate([e.get("first_step", 0) + np.arange(len(e["action"])) for e in episodes]),
        holds_release=np.concatenate([release_chunks(e["action"], chunk_size) for e in episodes]),
    )


def state_stats(demo_dirs: DemoFolders, min_std: float = 1e-2) -> dict[str, list[float]]:
    """Mean and standard deviation of the robot state over every step of the episodes training
    learns from (``trained_episodes``: failed ones are not), what a model's ``proprio_stats`` z-score
    ``obs["state"]`` with. ``min_std`` keeps a dimension that stands still in the demos (a fixed
    joint) from blowing up the smallest change later.

    Raises:
        ValueError: the demos hold no such steps, or their states are not all of one width.
    """
    states = [np.asarray(e["state"], dtype=np.float64) for e in trained_episodes(demo_dirs) if len(e["state"])]
    widths = {s.shape[-1] for s in states}
    if not states or len(widths) != 1:
        raise ValueError(f"{demo_dirs}: the demos need steps with a robot state of one width, got widths {widths}")
    state = np.concatenate(states)
    return {"mean": state.mean(0).tolist(), "std": np.maximum(state.std(0), min_std).tolist()}


def epoch_pool(samples: SFTSamples, first_frame_repeats: int, release_frame_repeats: int = 1) -> np.ndarray | int:
    """What one shuffled epoch draws from: every sample once, each episode's first frame
    ``first_frame_repeats`` times in all, and each sample whose chunk holds the release
    ``release_frame_repeats`` times in all (both 1: the plain epoch, ``len(samples)``)."""
    if first_frame_repeats == 1 and release_frame_repeats == 1:
        return len(samples)
    first = np.flatnonzero(samples.episode_step == 0)
    release = np.flatnonzero(samples.holds_release)
    return np.concatenate([np.arange(len(samples))] + [first] * (first_frame_repeats - 1)
                          + [release] * (release_frame_repeats - 1))


def stack_images(episodes: list[dict[str, np.ndarray]], size: int | None = None) -> np.ndarray:
    """Every episode's images in one uint8 array ``[M, S, S, 3]``, each resized once, straight to
    ``size`` (the model's: a frame resized up to another folder's size and down again would be a
    blurred one the env never serves); None: folders recorded at other (square) sizes go to the largest.

    Raises:
        ValueError: images of several sizes that are not all square (with ``size`` None).
    """
    if size is not None:
        return np.concatenate([resize_images(e["image"], size) for e in episodes])
    sizes = sorted({tuple(e["image"].shape[1:3]) for e in episodes})
    if len(sizes) == 1:
        return np.concatenate([e["image"] for e in episodes])
    if any(h != w for h, w in sizes):
        raise ValueError(f"the demo folders hold images of several sizes, not all square ({sizes}, height x width); "
                         "record them at one --image-size")
    side = sizes[-1][0]
    return np.concatenate([resize_images(e["image"], side) for e in episodes])


def resize_images(images: np.ndarray, size: int, batch: int = 256) -> np.ndarray:
    """uint8 ``[M, H, W, 3]`` -> uint8 ``[M, size, size, 3]`` by ``resize_rgb`` (the envs' and the
    real camera's resize), ``batch`` images at a time; as is if already that size."""
    from vla_envs.core.images import resize_rgb

    if images.shape[1:3] == (size, size):
        return images
    return np.concatenate([resize_rgb(images[i : i + batch], (size, size)) for i in range(0, len(images), batch)])
