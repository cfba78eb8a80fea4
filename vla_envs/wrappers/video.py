"""``RecordVideo``: every sub-step of every env, tiled into one MP4, written off the rollout's thread.

Frames are tiled (one tile per env) with a text overlay ``t``, reward, and success, queued,
and encoded by a background thread, so ``step``/``chunk_step`` only pay for tiling.
"""

from __future__ import annotations

import math
import queue
import threading
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorWrapper
from PIL import Image, ImageDraw

from vla_envs.core.vector_env import ChunkVectorEnv

_STOP = object()


def tile_frames(images: np.ndarray, lines: list[str] | None = None, min_tile: int = 160) -> np.ndarray:
    """Tile ``images`` uint8 ``[N, H, W, 3]`` into a near-square grid, one caption per tile.

    Tiles smaller than ``min_tile`` pixels are upscaled (nearest) so captions stay readable;
    the result's sides are multiples of 16 (what H.264 encoders want).
    """
    n, h, w, _ = images.shape
    scale = max(1, math.ceil(min_tile / max(h, w)))
    th, tw = h * scale, w * scale
    cols = math.ceil(math.sqrt(n))
    rows = math.ceil(n / cols)
    out_h, out_w = _round16(rows * th), _round16(cols * tw)
    canvas = Image.new("RGB", (out_w, out_h))
    draw = ImageDraw.Draw(canvas)
    for i in range(n):
        r, c = divmod(i, cols)
        tile = Image.fromarray(images[i]).resize((tw, th), Image.NEAREST)
        canvas.paste(tile, (c * tw, r * th))
        if lines is not None:
            x, y = c * tw + 3, r * th + 2
            draw.rectangle([x - 2, y - 1, x + 6 * len(lines[i]) + 2, y + 11], fill=(0, 0, 0))
            draw.text((x, y), lines[i], fill=(255, 255, 255))
    return np.asarray(canvas)


def _round16(x: int) -> int:
    return (x + 15) // 16 * 16


def check_video_path(path: str | Path) -> Path:
    """``path`` as a Path if a video can be written there.

    Raises:
        ValueError: it does not end in ``.mp4``, is an existing folder, or lies under a file.
    """
    path = Path(path)
    if path.suffix.lower() != ".mp4":
        raise ValueError(f"video {str(path)!r}: the name must end in .mp4 (the video is H.264 in MP4)")
    if path.is_dir():
        raise ValueError(f"video {str(path)!r} is a folder; give a file name ending in .mp4")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"video {str(path)!r} cannot be written: {parent} is a file, not a folder")
    return path


def video_file(text: str) -> Path:
    """An argparse type for ``--video``: checked before the rollout whose frames it records."""
    import argparse

    try:
        return check_video_path(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


class RecordVideo(VectorWrapper):
    """Record every sub-step of a ``ChunkVectorEnv`` to ``path`` (MP4, H.264).

    Args:
        env: the vector env.
        path: output file ending in ``.mp4``; parent folders are created.
        fps: frames per second of the video.
        max_frames: stop recording after this many frames (the file stays valid).

    The file is complete after ``close()`` (of the wrapper or of the env through it).
    """

    def __init__(self, env: ChunkVectorEnv, path: str | Path, fps: int = 10, max_frames: int = 10_000):
        super().__init__(env)
        base = env.unwrapped
        if not isinstance(base, ChunkVectorEnv):
            raise TypeError(f"RecordVideo needs a ChunkVectorEnv, got {type(base).__name__}")
        self.path = check_video_path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps, self.max_frames = fps, max_frames
        self.frames_written = 0
        self._t = np.zeros(base.num_envs, np.int64)
        self._return = np.zeros(base.num_envs, np.float64)
        self._queue: queue.Queue = queue.Queue(maxsize=64)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._encode, name="video-writer", daemon=True)
        self._thread.start()
        base.add_step_observer(self._on_substep)

    def _encode(self) -> None:
        import imageio.v2 as imageio

        writer = None
        try:
            while True:
                frame = self._queue.get()
                if frame is _STOP:
                    break
                if writer is None:
                    writer = imageio.get_writer(self.path, fps=self.fps, codec="libx264",
                                                macro_block_size=16, quality=7)
                writer.append_data(frame)
        except BaseException as e:  # noqa: BLE001 - surfaced on close()
            self._error = e
            while self._queue.get() is not _STOP:
                pass
        finally:
            if writer is not None:
                writer.close()

    def _push(self, images: np.ndarray, lines: list[str]) -> None:
        if self.frames_written >= self.max_frames:
            return
        self._queue.put(tile_frames(images, lines))
        self.frames_written += 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        mask = (options or {}).get("reset_mask")
        mask = np.ones(self.num_envs, bool) if mask is None else mask
        self._t[mask] = 0
        self._return[mask] = 0.0
        self._push(obs["image"], [f"env {i} t={t}" for i, t in enumerate(self._t)])
        return obs, info

    def _on_substep(self, event: dict[str, Any]) -> None:
        valid = event["valid"]
        self._t[valid] += 1
        self._return[valid] += event["reward"][valid]
        lines = [
            f"t={self._t[i]} r={event['reward'][i]:+.2f} R={self._return[i]:.2f}"
            + (" SUCCESS" if event["success"][i] else "")
            for i in range(self.num_envs)
        ]
        self._push(event["obs"]["image"], lines)
        # an env whose episode ended here counts its next episode from 0 (it is reset before its next
        # valid step, at once or at the chunk's end)
        self._t[event["done"]] = 0
        self._return[event["done"]] = 0.0

    def chunk_step(self, actions: Any):
        return self.env.chunk_step(actions)

    def close(self, **kwargs: Any) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.env.close(**kwargs)
        if self._error is not None:
            raise RuntimeError(f"writing {self.path} failed: {self._error}") from self._error
