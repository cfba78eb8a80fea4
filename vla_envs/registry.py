"""Every task id this package provides, registered with Gymnasium on ``import vla_envs``.

``gym.make(id, num_envs=N, **kwargs)`` and ``gym.make_vec(id, num_envs=N, **kwargs)`` both
return a ``ChunkVectorEnv``. Keyword arguments are the backend's (``sim_backend``,
``image_size``, ...) plus the contract's (``auto_reset``, ``ignore_terminations``,
``chunk_reset``, ``use_fixed_reset_state_ids``, ``group_size``, ...). ``evaluation=True`` makes an
env that measures a policy: a task's training-only options (``TaskSpec.training_only``, e.g.
PutOnPlate's expert starts, LIBERO's fast rendering) are then refused. A task's options are typed
(``TaskSpec.options``, e.g. ``tasks.put_on_plate.options.PutOnPlateOptions``): an unknown name or
a bad value is refused, naming it, before anything is built.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable

import gymnasium as gym

from vla_envs.core.options import TaskOptions
from vla_envs.errors import VlaEnvError


@dataclass(frozen=True)
class TaskSpec:
    """A registered task: which backend builds it and with what arguments."""

    id: str
    backend: str
    """``"maniskill"``, ``"libero"`` or ``"franka"``."""
    suite: str
    """Group of related tasks (e.g. ``"maniskill-primitives"``)."""
    max_episode_steps: int
    """The task's default time limit."""
    factory: str
    """``"module:function"`` called as ``function(num_envs=N, **kwargs, **user_kwargs)``."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    requires: tuple[str, ...] = ()
    """Python modules the backend needs."""
    extra: str = ""
    """The pip extra that installs ``requires``."""
    expert: str = ""
    """``"module:Class"`` of a scripted expert driven by the backend's ``expert_state``."""
    options: type[TaskOptions] | None = None
    """The task's typed options (``core.options.TaskOptions``): their names, checks, and which
    are training only. None: the factory checks its own arguments."""
    control_hz: float = 20.0
    """Actions per second: a video of its steps plays in real time at this frame rate."""

    def make_expert(self, num_envs: int, seed: int = 0, options: dict[str, Any] | None = None) -> Any:
        """The task's scripted expert for ``num_envs`` envs, made with its keyword ``options``.

        Raises:
            ValueError: the task has none, or ``options`` it does not take or refuses (named).
        """
        if not self.expert:
            raise ValueError(f"{self.id} has no scripted expert")
        module, _, name = self.expert.partition(":")
        try:
            return getattr(importlib.import_module(module), name)(num_envs, seed=seed, **(options or {}))
        except TypeError as e:
            raise ValueError(f"expert options {options}: {e} (see {self.expert})") from e

    @property
    def training_only(self) -> dict[str, str]:
        """Options an evaluation refuses when set to anything but their default, each with why."""
        return self.options.training_only() if self.options else {}

    def check_kwargs(self, kwargs: dict[str, Any], *, evaluation: bool = False, where: str = "") -> None:
        """Raises ``ValueError`` naming the first unknown or bad option of ``kwargs`` (``gym.make``'s
        keywords), or, for an evaluation, the first training-only one it sets: what a recipe's
        loader calls before anything is built."""
        if evaluation:
            for name, why in self.training_only.items():
                if name in kwargs and not self.options.is_default(name, kwargs[name]):
                    raise ValueError(f"{where}{name} {why}: for training only, never for evaluation")
        if self.options is not None:
            self.options.split(kwargs, where=where)
        else:
            self._check_factory_kwargs(kwargs, where)

    def _check_factory_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        """For a task without typed options: ``kwargs`` against its factory's signature, whose
        ``**kwargs`` (if any) are the contract's (``ChunkVectorEnv``'s), as a ``ValueError`` naming
        the first unknown one instead of a ``TypeError`` from deep inside ``gym.make``."""
        from vla_envs.core.options import contract_options

        params = inspect.signature(self._factory()).parameters
        mine = [n for n, p in params.items() if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
                and n != "num_envs"]
        others = tuple(n for n in contract_options() if n not in mine
                       ) if any(p.kind is p.VAR_KEYWORD for p in params.values()) else ()
        unknown = [k for k in kwargs if k not in mine and k not in others]
        if unknown:
            close = difflib.get_close_matches(unknown[0], (*mine, *others), n=3, cutoff=0.6)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{where}unknown option {unknown[0]!r}{hint}; the task's options: {', '.join(mine)}"
                             + (f"; the vector env's: {', '.join(others)}" if others else ""))

    def check_required(self, kwargs: dict[str, Any], where: str = "") -> None:
        """Raises ``ValueError`` naming the first argument the factory needs that neither the spec
        nor ``kwargs`` (all of ``gym.make``'s keywords) gives."""
        params = inspect.signature(self._factory()).parameters
        given = {**self.kwargs, **kwargs, "num_envs": None}
        missing = [n for n, p in params.items() if p.default is p.empty
                   and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in given]
        if missing:
            raise ValueError(f"{where}the option {missing[0]!r} is required: gym.make({self.id!r}, {missing[0]}=...)")

    def _factory(self) -> Callable[..., Any]:
        module, _, name = self.factory.partition(":")
        return getattr(importlib.import_module(module), name)

    def backend_installed(self) -> bool:
        return all(importlib.util.find_spec(m) is not None for m in self.requires)

    def assets_status(self) -> str:
        """What ``vla-envs list`` shows: the factory module's ``assets_status(spec)`` if it
        has one, else ``"present"``."""
        module, _, _ = self.factory.partition(":")
        check = getattr(importlib.import_module(module), "assets_status", None)
        return "present" if check is None else str(check(self))

    def make(self, num_envs: int = 1, **kwargs: Any):
        return self._factory()(num_envs=num_envs, **{**self.kwargs, **kwargs})


_MANISKILL = "vla_envs.backends.maniskill.make:make_maniskill_vector_env"
_MANISKILL_PRIMITIVES = {
    # ManiSkill's own ids live in Gymnasium's default namespace once mani_skill is imported;
    # ours carry the "vla/" namespace so neither registration overrides the other.
    "vla/PickCube-v1": ("PickCube-v1", 50, "pick up the red cube and move it to the green target"),
    "vla/PushCube-v1": ("PushCube-v1", 50, "push the cube onto the red and white target"),
    "vla/StackCube-v1": ("StackCube-v1", 50, "stack the red cube on top of the green cube"),
    "vla/PullCube-v1": ("PullCube-v1", 50, "pull the cube onto the red and white target"),
}

TASKS: dict[str, TaskSpec] = {
    env_id: TaskSpec(env_id, "maniskill", "maniskill-primitives", steps, _MANISKILL,
                     {"task": task, "instruction": text}, ("mani_skill", "sapien"), "maniskill", control_hz=20.0)
    for env_id, (task, steps, text) in _MANISKILL_PRIMITIVES.items()
}

_PUT_ON_PLATE = "vla_envs.tasks.put_on_plate.make:make_put_on_plate_vector_env"


def _put_on_plate_specs() -> dict[str, TaskSpec]:
    from vla_envs.tasks.put_on_plate.options import PutOnPlateOptions
    from vla_envs.tasks.put_on_plate.variants import CURRICULUM, VARIANTS

    return {env_id: TaskSpec(env_id, "maniskill", f"put-on-plate/{v.category}", 80, _PUT_ON_PLATE,
                             {"variant": env_id}, ("mani_skill", "sapien"), "maniskill",
                             expert="vla_envs.tasks.put_on_plate.expert:ScriptedExpert",
                             options=PutOnPlateOptions, control_hz=5.0)
            for env_id, v in (VARIANTS | CURRICULUM).items()}


TASKS.update(_put_on_plate_specs())

_LIBERO = "vla_envs.backends.libero.make:make_libero_vector_env"


def _libero_specs() -> dict[str, TaskSpec]:
    from vla_envs.backends.libero.options import LiberoOptions
    from vla_envs.backends.libero.suites import GROUPS, max_steps  # data only: LIBERO is imported lazily

    return {group: TaskSpec(group, "libero", "libero", max_steps(group), _LIBERO, {"group": group},
                            ("libero", "robosuite", "mujoco"), "libero",
                            options=LiberoOptions, control_hz=20.0)
            for group in GROUPS}


TASKS.update(_libero_specs())

TASKS["franka/PutOnPlate-v0"] = TaskSpec(
    "franka/PutOnPlate-v0", "franka", "real", 80, "vla_envs.backends.franka.make:make_franka_vector_env",
    requires=("franky", "pyrealsense2"), extra="robot", control_hz=5.0)


def get_task(env_id: str) -> TaskSpec:
    """The spec of ``env_id``; an unknown id raises a KeyError listing close matches."""
    if env_id in TASKS:
        return TASKS[env_id]
    close = difflib.get_close_matches(env_id, TASKS, n=5, cutoff=0.5)
    hint = f"did you mean: {', '.join(close)}? " if close else ""
    raise VlaEnvError(
        f"unknown env id {env_id!r}; {hint}`vla-envs list` prints every id "
        f"({len(TASKS)} registered)"
    )


def _entry_point(env_id: str) -> Callable[..., Any]:
    def make(num_envs: int = 1, evaluation: bool = False, **kwargs: Any):
        spec = get_task(env_id)
        if evaluation or spec.options is None:  # typed options are checked by the factory itself
            spec.check_kwargs(kwargs, evaluation=evaluation, where=f"{env_id}: ")
        if not spec.backend_installed():
            from vla_envs.errors import BackendNotInstalledError

            raise BackendNotInstalledError(
                f"{env_id} needs the {spec.backend} backend ({', '.join(spec.requires)}); "
                f"install it with: bash scripts/setup.sh {spec.extra}   "
                f"(or: pip install 'vla-rl[{spec.extra}]')"
            )
        spec.check_required(kwargs, where=f"{env_id}: ")
        return spec.make(num_envs=num_envs, **kwargs)

    make.__name__ = f"make_{env_id.replace('/', '_').replace('-', '_')}"
    return make


def register_all() -> None:
    """Register every task id with Gymnasium (idempotent)."""
    for env_id in TASKS:
        if env_id in gym.registry:
            continue
        entry = _entry_point(env_id)
        gym.register(env_id, entry_point=entry, vector_entry_point=entry,
                     disable_env_checker=True, order_enforce=False)
