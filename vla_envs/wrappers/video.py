"""``RecordVideo``: every sub-step of every env, tiled into one MP4, written off the rollout's thread.

Frames are tiled (one tile per env) with a text overlay ``t``, reward, and success, queued,
and encoded by a background thread, so ``step``/``chunk_step`` only pay for tiling. A video that
could not be written completely (an encoder error, a full disk) is reported by ``close()`` as
``VideoWriteError``, after the rollout, which is never interrupted by it.
"""

from __future__ import annotations

import math
import os
import queue
import struct
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium.vector import VectorWrapper
from PIL import Image, ImageDraw

from vla_envs.core.vector_env import ChunkVectorEnv
from vla_envs.errors import VideoWriteError

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
        ValueError: it does not end in ``.mp4``, is an existing folder, lies under a file, or cannot
            be created (a read-only place).
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
    if parent == path.parent:  # try it: what fails here would fail only after the whole rollout
        existed = path.exists()
        try:
            with open(path, "ab"):
                pass
        except OSError as e:
            raise ValueError(f"video {str(path)!r} cannot be written: {e.strerror or e}") from None
        if not existed:
            path.unlink()
    elif not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"video {str(path)!r} cannot be written: {parent} is not writable")
    return path


def mp4_is_complete(path: str | Path) -> bool:
    """Whether ``path`` is a whole MP4 file: its top-level boxes fill it exactly and include the
    ``moov`` index, which the encoder writes last (a file cut short by a full disk fails this)."""
    try:
        data_size = Path(path).stat().st_size
        with open(path, "rb") as f:
            offset, kinds = 0, set()
            while offset < data_size:
                f.seek(offset)
                header = f.read(16)
                if len(header) < 8:
                    return False
                size, kind = struct.unpack(">I4s", header[:8])
                if size == 1 and len(header) == 16:  # a 64-bit size follows
                    size = struct.unpack(">Q", header[8:16])[0]
                elif size == 0:  # the box runs to the end of the file
                    size = data_size - offset
                if size < 8:
                    return False
                kinds.add(kind)
                offset += size
    except OSError:
        return False
    return offset == data_size and b"moov" in kinds and b"mdat" in kinds


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
        fps: frames per second of the video (the task's control rate, ``TaskSpec.control_hz``, plays
            it in real time).
        max_frames: stop recording after this many frames (the file stays valid; a warning says so).

    The file is complete after ``close()`` (of the wrapper or of the env through it).
    """

    def __init__(self, env: ChunkVectorEnv, path: str | Path, fps: float = 10, max_frames: int = 10_000):
        super().__init__(env)
        base = env.unwrapped
        if not isinstance(base, ChunkVectorEnv):
            raise TypeError(f"RecordVideo needs a ChunkVectorEnv, got {type(base).__name__}")
        self.path = check_video_path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.fps, self.max_frames = fps, max_frames
        self.frames_written = 0
        self._cut = False  # max_frames reached (and said)
        self._return = np.zeros(base.num_envs, np.float64)
        self._waiting = np.zeros(base.num_envs, bool)  # its episode ended; it has not been reset yet
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
                try:
                    writer.close()  # the encoder writes most of a short video only now
                except BaseException as e:  # noqa: BLE001 - surfaced on close()
                    self._error = self._error or e
                # ffmpeg's failure to finish the file is not reported by the writer: look at the file
                if self._error is None and not mp4_is_complete(self.path):
                    self._error = OSError(f"the encoder could not finish the file ({self.path.stat().st_size} "
                                          "bytes written; is the disk full?)")

    def _push(self, images: np.ndarray, lines: list[str]) -> None:
        if self._error is not None:
            return  # a failed encoder takes no more frames; close() reports it
        if self.frames_written >= self.max_frames:
            if not self._cut:  # once: a video that ends before its rollout says why
                self._cut = True
                warnings.warn(f"RecordVideo: {self.path} ends at max_frames={self.max_frames}; the rollout goes on "
                              "unrecorded (a larger max_frames records more)", stacklevel=2)
            return
        self._queue.put(tile_frames(images, lines))
        self.frames_written += 1

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        obs, info = self.env.reset(seed=seed, options=options)
        mask = (options or {}).get("reset_mask")
        mask = np.ones(self.num_envs, bool) if mask is None else mask
        self._return[mask] = 0.0
        self._waiting[mask] = False
        elapsed = self.env.unwrapped.elapsed_steps
        self._push(obs["image"], [f"env {i} t={t}" for i, t in enumerate(elapsed)])
        return obs, info

    def _on_substep(self, event: dict[str, Any]) -> None:
        """Captions from the env's own step count: ``t`` is the running episode's step (an auto-reset
        episode's first frame is its first step), ``R`` its return; an env whose episode ended and
        waits for its reset (``chunk_reset="end_of_chunk"``) shows its last frame, marked so."""
        stepped, reward, elapsed = event["stepped"], event["reward"], event["elapsed"]
        first = stepped & self._waiting  # the first step of the episode after a reset
        self._return[first] = 0.0
        self._waiting[first] = False
        self._return[stepped] += reward[stepped]
        lines = []
        for i in range(self.num_envs):
            if self._waiting[i]:
                lines.append(f"t={elapsed[i]} ended R={self._return[i]:.2f} (waits for reset)")
            else:
                lines.append(f"t={elapsed[i]} r={reward[i] if stepped[i] else 0.0:+.2f} R={self._return[i]:.2f}"
                             + (" SUCCESS" if event["success"][i] else ""))
        self._push(event["obs"]["image"], lines)
        self._waiting |= event["done"]

    def chunk_step(self, actions: Any):
        return self.env.chunk_step(actions)

    def close(self, **kwargs: Any) -> None:
        if self._thread.is_alive():
            self._queue.put(_STOP)
            self._thread.join()
        self.env.close(**kwargs)
        if self._error is not None:
            raise VideoWriteError(f"writing {self.path} failed: {self._error}") from self._error


def close_recording(env: Any) -> str | None:
    """Close ``env`` (a ``RecordVideo`` or any env); the message of a video it could not write, else
    None. The rollout it recorded is complete either way: its numbers are reported with the message."""
    try:
        env.close()
    except VideoWriteError as e:
        return str(e)
    return None
