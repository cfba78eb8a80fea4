"""Wrappers around ``ChunkVectorEnv``."""

from vla_envs.wrappers.video import RecordVideo, tile_frames

__all__ = ["RecordVideo", "tile_frames"]
