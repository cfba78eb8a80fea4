"""Demonstrations on disk: the format the scripted experts write and the SFT stage reads.

A demo folder holds one ``episode_XXXXXX.npz`` per episode plus ``index.json``::

    index.json      {"format": "vla-demos-v1", "env_id", "asset_pack", "action_noise", "expert_kwargs",
                     "env_kwargs" (the gym.make options the images were made with, when known),
                     "episodes": [
                        {"file", "instruction", "state_id", "length", "success_once",
                         "success_at_end", "return"}, ...]}
    episode_*.npz   image uint8 [T, H, W, 3]   observation before each action
                    state float32 [T, S]
                    action float32 [T, 7]      the expert's action (env convention); with
                                               action_noise > 0 the env executed it plus
                                               Gaussian noise of that std (translation, yaw)
                    reward float32 [T], success bool [T]
                    instruction str, state_id int
                    scene float32 [T, 7 K]    optional (scripted experts): the privileged world
                                               poses (xyz + wxyz) of the K bodies named by the
                                               index's "scene_bodies", at each observation; labels
                                               for vision pretraining, never a policy input
"""

from __future__ import annotations

import contextlib
import json
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "vla-demos-v1"
SCENE_BODIES = ("tcp", "object", "plate")
"""Bodies of a scripted expert's privileged state whose poses demos record (vision labels)."""


def scene_poses(states: list[dict[str, np.ndarray]]) -> np.ndarray:
    """The ``SCENE_BODIES`` poses of each env's expert state: float ``[N, 7 K]`` (xyz + wxyz)."""
    return np.stack([np.concatenate([s[k].reshape(-1) for k in SCENE_BODIES]) for s in states])


def check_new_demo_folder(folder: str | Path) -> Path:
    """``folder`` if new demos can be written there without touching earlier ones.

    Raises:
        FileExistsError: ``folder`` is a file, or already holds demos (its episodes would be
            overwritten and its index replaced).
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise FileExistsError(f"demo folder {folder} is a file; give a new folder")
    if (folder / "index.json").exists() or next(folder.glob("episode_*.npz"), None) is not None:
        raise FileExistsError(f"demo folder {folder} already holds demos; give a new folder (several demo folders "
                              "can be trained on together: vla-train sft --demos A B)")
    return folder


class EpisodeRecorder:
    """Accumulates per-env transitions and writes finished episodes to ``folder``, which must not
    hold demos yet (``check_new_demo_folder``)."""

    def __init__(self, folder: str | Path, num_envs: int, env_id: str, asset_pack: str | None,
                 only_success: bool = True, action_noise: float = 0.0,
                 scene_bodies: tuple[str, ...] = (), expert_kwargs: dict | None = None,
                 env_kwargs: dict | None = None):
        self.folder = check_new_demo_folder(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.only_success = only_success
        self.index: dict[str, Any] = {"format": FORMAT, "env_id": env_id, "asset_pack": asset_pack,
                                      "action_noise": action_noise, "expert_kwargs": dict(expert_kwargs or {}),
                                      "episodes": []}
        if env_kwargs is not None:  # a model trained on these images needs them again (camera_crop)
            self.index["env_kwargs"] = json.loads(json.dumps(env_kwargs, default=str))
        if scene_bodies:
            self.index["scene_bodies"] = list(scene_bodies)
        self.scene_bodies = tuple(scene_bodies)
        self._buf: list[dict[str, list]] = [self._empty() for _ in range(num_envs)]
        self._next = 0

    @staticmethod
    def _empty() -> dict[str, list]:
        return {"image": [], "state": [], "action": [], "reward": [], "success": [], "scene": []}

    def add(self, obs: dict[str, Any], actions: np.ndarray, rewards: np.ndarray, success: np.ndarray,
            scene: np.ndarray | None = None, envs: np.ndarray | None = None) -> None:
        """One step of every env (or of the envs where the bool mask ``envs`` ``[N]`` is True):
        the observation the actions were taken from, and with ``scene_bodies`` the bodies' poses
        at that observation, float ``[N, 7 K]``."""
        if (scene is None) != (not self.scene_bodies):
            raise ValueError(f"scene poses must be given exactly when scene_bodies is set ({self.scene_bodies})")
        if scene is not None and scene.shape != (len(self._buf), 7 * len(self.scene_bodies)):
            raise ValueError(f"scene has shape {scene.shape}; expected {(len(self._buf), 7 * len(self.scene_bodies))} "
                             f"(xyz + wxyz of {self.scene_bodies} per env)")
        for i, b in enumerate(self._buf):
            if envs is not None and not envs[i]:
                continue
            if scene is not None:
                b["scene"].append(scene[i])
            b["image"].append(obs["image"][i])
            b["state"].append(obs["state"][i])
            b["action"].append(actions[i])
            b["reward"].append(rewards[i])
            b["success"].append(success[i])

    def discard(self, i: int) -> None:
        """Env ``i``'s episode ended and is not to be kept: drop its steps."""
        self._buf[i] = self._empty()

    def finish(self, i: int, instruction: str, state_id: int, episode: dict[str, Any],
               extra: dict[str, Any] | None = None) -> bool:
        """Env ``i``'s episode ended: write it (if kept; never one without steps) and start a new
        buffer. ``extra``: JSON values added to its index entry (e.g. a real episode's operator
        label). Returns kept."""
        b, self._buf[i] = self._buf[i], self._empty()
        kept = bool(b["action"]) and (bool(episode["success_once"]) or not self.only_success)
        if kept:
            name = f"episode_{self._next:06d}.npz"
            self._next += 1
            scene = {"scene": np.stack(b["scene"]).astype(np.float32)} if b["scene"] else {}
            # each file on the disk before a name points at it: after a power loss the index lists
            # only whole episodes (a real robot's session is not lost to one cut-off file)
            with _written_then_renamed(self.folder / name) as f:
                np.savez_compressed(f, image=np.stack(b["image"]), state=np.stack(b["state"]),
                                    action=np.stack(b["action"]).astype(np.float32),
                                    reward=np.asarray(b["reward"], np.float32),
                                    success=np.asarray(b["success"], bool),
                                    instruction=np.asarray(instruction), state_id=np.asarray(state_id), **scene)
            self.index["episodes"].append({"file": name, "instruction": instruction, "state_id": int(state_id),
                                           **{k: float(v) for k, v in episode.items()}, **(extra or {})})
            with _written_then_renamed(self.folder / "index.json") as f:
                f.write(json.dumps(self.index, indent=1).encode())
        return kept


@contextlib.contextmanager
def _written_then_renamed(path: Path):
    """A binary file to fill, flushed to the disk and renamed to ``path`` (then the folder's entry)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
    finally:
        tmp.unlink(missing_ok=True)


def load_index(folder: str | Path) -> dict[str, Any]:
    """A demo folder's ``index.json``, checked.

    Raises:
        FileNotFoundError: no ``index.json``.
        ValueError: it is damaged or of another format, named.
    """
    index_path = Path(folder) / "index.json"
    if not index_path.is_file():
        raise FileNotFoundError(f"{index_path} not found: not a demo folder (see vla-envs collect-demos)")
    try:
        index = json.loads(index_path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{index_path} is not valid JSON ({e}): the demo folder's index is damaged") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        found = index.get("format") if isinstance(index, dict) else type(index).__name__
        raise ValueError(f"{index_path}: format {found!r}, expected {FORMAT!r}")
    return index


def load_demos(folder: str | Path) -> tuple[dict[str, Any], list[dict[str, np.ndarray]]]:
    """Read a demo folder: its index (``load_index``) and every episode's arrays.

    Raises:
        FileNotFoundError: no ``index.json``.
        ValueError: a damaged index or episode file, named.
    """
    folder = Path(folder)
    index = load_index(folder)
    episodes = []
    for e in index.get("episodes", []):
        path = folder / str(e.get("file"))
        try:
            with np.load(path) as z:
                episodes.append({k: z[k] for k in z.files})
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:  # missing, cut short, not arrays
            raise ValueError(f"{path}, an episode that {folder / 'index.json'} lists, cannot be read: {err}") from None
    return index, episodes
