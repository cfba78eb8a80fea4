"""Typed task options: the keyword arguments of ``gym.make(id, **kwargs)`` that belong to a task.

A task declares its options as a frozen dataclass deriving from ``TaskOptions``, one docstring per
field and the checks in ``__post_init__``, so a bad value fails before any simulator starts, naming
the option and what is allowed. An option marked ``training_only(...)`` is refused by the registry,
unless it keeps its default, when the env is made for evaluation (``gym.make(..., evaluation=True)``).

``TaskOptions.split`` separates a task's options from the contract's (``ChunkVectorEnv``'s) and
refuses anything that is neither, with close matches: a typo is an error, not a silently ignored
keyword.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

TRAINING_ONLY = "training_only"


def training_only(why: str, **kwargs: Any):
    """A dataclass field an evaluation refuses when set to anything but its default (which is what
    evaluations run with); ``why`` says what it changes, for the error."""
    return field(metadata={TRAINING_ONLY: why}, **kwargs)


def contract_options() -> tuple[str, ...]:
    """The keyword options of ``ChunkVectorEnv`` (auto_reset, ignore_terminations, time_limit, ...)."""
    from vla_envs.core.vector_env import ChunkVectorEnv

    params = inspect.signature(ChunkVectorEnv.__init__).parameters
    return tuple(name for name, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY)


@dataclass(kw_only=True, frozen=True)
class TaskOptions:
    """Base of every task's options."""

    BACKEND_OPTIONS: ClassVar[tuple[str, ...]] = ()
    """Options the task's factory passes to its simulator backend (e.g. ``sim_backend``)."""

    @classmethod
    def names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def training_only(cls) -> dict[str, str]:
        """Each training-only option with what it changes."""
        return {f.name: f.metadata[TRAINING_ONLY] for f in fields(cls) if TRAINING_ONLY in f.metadata}

    @classmethod
    def is_default(cls, name: str, value: Any) -> bool:
        """Whether ``value`` is option ``name``'s default (a list as its tuple, as YAML gives it)."""
        default = next(f.default for f in fields(cls) if f.name == name)
        return (tuple(value) if isinstance(value, list) else value) == default

    @classmethod
    def split(cls, kwargs: dict[str, Any], where: str = ""):
        """``(cls(**task's options), {the rest})``: the rest must be contract or backend options.
        An unknown name or a bad value raises ``ValueError`` naming it and what is allowed."""
        others = (*contract_options(), *cls.BACKEND_OPTIONS)
        unknown = [k for k in kwargs if k not in cls.names() and k not in others]
        if unknown:
            allowed = (*cls.names(), *others)
            close = difflib.get_close_matches(unknown[0], allowed, n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{where}unknown option {unknown[0]!r}{hint}; the task's options: "
                             f"{', '.join(cls.names())}; the vector env's and backend's: {', '.join(others)}")
        mine = {k: v for k, v in kwargs.items() if k in cls.names()}
        try:
            options = cls(**mine)
        except ValueError as e:
            raise ValueError(f"{where}{e}") from None
        return options, {k: v for k, v in kwargs.items() if k not in mine}

    def _need(self, ok: bool, name: str, allowed: str) -> None:
        """Raises ``ValueError`` naming the option, its value and what is allowed."""
        if not ok:
            raise ValueError(f"{name}={getattr(self, name)!r}; {allowed}")

    def _set(self, name: str, value: Any) -> None:
        """Normalises a field in ``__post_init__`` (e.g. a YAML list to a tuple) of a frozen instance."""
        object.__setattr__(self, name, value)
