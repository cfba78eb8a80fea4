"""Exceptions raised by vla_envs. Each names what was wrong and what is allowed."""

from __future__ import annotations


class VlaEnvError(Exception):
    """Base class of every error raised by vla_envs."""


class BackendNotInstalledError(VlaEnvError, ImportError):
    """A simulator backend's Python package or system library is missing."""


class AssetsMissingError(VlaEnvError, FileNotFoundError):
    """A task's assets are not on disk; the message names the fetch command."""


class WorkerError(VlaEnvError, RuntimeError):
    """An env worker process raised, died or hung. ``env_index`` names the env; ``hung`` is True
    when it was alive but did not answer within its deadline."""

    def __init__(self, message: str, env_index: int, hung: bool = False):
        super().__init__(message)
        self.env_index = env_index
        self.hung = hung


class ClosedEnvError(VlaEnvError, RuntimeError):
    """The env was used after ``close()``."""


class VideoWriteError(VlaEnvError, RuntimeError):
    """A video could not be written completely (the encoder failed, the disk filled up); the
    rollout it recorded ran to its end."""
