"""Exceptions raised by vla_trainer.models. Each names what was wrong and what is allowed."""

from __future__ import annotations


class VLAModelError(Exception):
    """Base class of every error raised by vla_trainer.models."""


class InvalidInputError(VLAModelError, ValueError):
    """An observation or tensor handed to a model or policy has the wrong type, shape or value."""


class UnknownUnnormKeyError(VLAModelError, ValueError):
    """The ``unnorm_key`` names no action statistics of the checkpoint; lists the ones it has."""


class ConfigMismatchError(VLAModelError, ValueError):
    """A config (or a checkpoint's config) is invalid or does not fit the class; names the field."""


class AdapterMismatchError(VLAModelError, ValueError):
    """A LoRA adapter was trained on another base model than the one it is applied to."""


class CorruptCheckpointError(VLAModelError, ValueError):
    """A checkpoint file cannot be read (truncated, overwritten, not what its name says); names
    the file and what is wrong with it. Nothing on disk is changed by the failed read."""
