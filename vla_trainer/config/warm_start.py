"""The typed recipe of a supervised warm start (``vla-train warm-start --config NAME``).

A warm start is made in stages, each writing one folder of the run: scripted-expert demos
(``demos/``), optionally vision pretraining of a new model (``vision/``), then SFT stages
(``sft_0/``, ``sft_1/``, ...), each continuing from the one before; ``sft/`` is a copy of the
last. Shipped recipes live in ``vla_trainer/recipes/warm_start/``; a recipe may inherit another
(``defaults: [name]``) and ``key=value`` overrides change any field (``stages.0.sft.steps=50``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Sequence

from .loading import RECIPE_DIR, load_recipe
from .sft import SFTConfig


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise ValueError(what)


@dataclass(kw_only=True)
class DemoSettings:
    """Scripted-expert demonstrations, recorded with ``vla-envs collect-demos``."""

    env_id: str = "PutOnPlateInScene25Main-v3"
    """The task the expert is recorded on (its training split; held-out twins are never used)."""
    episodes: int = 900
    """Episodes to run; the expert's failures are not kept."""
    seed: int = 300
    """Seeds the episodes' initial states (and so the demos)."""
    num_envs: int = 2
    """Simulator workers."""
    image_size: int = 64
    """Camera side in pixels: the model's input size."""
    env_from: str = "cpu_ppo_tiny_put_on_plate"
    """The RL recipe whose ``env.train.env_kwargs`` (the scene RL sees: assets, low-poly Panda,
    camera crop) the demos are recorded with."""
    expert_kwargs: dict[str, Any] = field(default_factory=lambda: {"max_speed": 1.0})
    """Scripted-expert options (PutOnPlate: ``max_speed``, the largest step as a fraction of the
    controller's 10 cm)."""

    def __post_init__(self) -> None:
        for name in ("episodes", "num_envs", "image_size"):
            _need(getattr(self, name) >= 1, f"demos.{name}={getattr(self, name)!r}: an integer >= 1")


@dataclass(kw_only=True)
class VisionSettings:
    """Vision pretraining of a new model: its towers learn where the TCP, object and plate are
    (``vla-train pretrain-vision``)."""

    steps: int = 400
    """Optimizer steps."""
    batch_size: int = 64
    """Frames per step."""
    lr: float = 3e-4
    """AdamW learning rate."""
    eval_every: int = 100
    """Validation every N steps."""
    seed: int = 0
    """Seeds the new model's weights and the minibatch order."""
    slot_embeddings: Literal["zeros", "learned"] = "learned"
    """The new OpenVLA-OFT model's action-slot inputs."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "eval_every"):
            _need(getattr(self, name) >= 1, f"vision.{name}={getattr(self, name)!r}: an integer >= 1")
        _need(self.lr > 0, f"vision.lr={self.lr!r}: a learning rate > 0")


@dataclass(kw_only=True)
class StageSettings:
    """One SFT stage: what the model gains before it, and how it is trained."""

    patch_positions: Optional[Literal["none", "sincos"]] = None
    """``sincos`` gives a model without one a trained place code on its patches (None: as it is)."""
    layout_token: Optional[Literal["none", "linear"]] = None
    """``linear`` gives a model without one a token that maps all patches (None: as it is)."""
    proprio: bool = False
    """The policy also reads the robot state from here on (z-scored by the demos' statistics)."""
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(steps=1000, batch_size=32, lr=3e-4))
    """Behaviour cloning settings (``config.sft.SFTConfig``)."""


@dataclass(kw_only=True)
class WarmStartConfig:
    """A warm start: demos, where the model comes from, and the SFT stages."""

    preset: str = "tiny-openvla-oft"
    """The model preset a new model is built from (``init: vision``)."""
    init: str = "vision"
    """``vision``: a new ``preset`` model, vision-pretrained (``vision`` settings); otherwise a
    checkpoint folder to continue from (e.g. a shipped warm start, for a variant's own). A relative
    path is taken from the working directory when it exists there, else from the project's root."""
    demos: DemoSettings = field(default_factory=DemoSettings)
    """The demonstrations every stage trains on."""
    vision: VisionSettings = field(default_factory=VisionSettings)
    """Used with ``init: vision`` only."""
    stages: list[StageSettings] = field(default_factory=list)
    """The SFT stages in order; stage i writes ``sft_<i>`` and continues from the one before."""
    publish_to: Optional[str] = None
    """Where ``--publish`` writes the last stage (float16, with ``made_by.json``); relative paths as
    for ``init``."""

    def __post_init__(self) -> None:
        _need(len(self.stages) >= 1, "stages: at least one SFT stage")


WARM_START_RECIPE_DIR = RECIPE_DIR / "warm_start"
"""Where ``vla-train warm-start --config NAME`` finds ``NAME.yaml``."""


def load_warm_start(recipe: str | Path, overrides: Sequence[str] = ()) -> WarmStartConfig:
    """A warm-start recipe by name (from ``WARM_START_RECIPE_DIR``) or path, with ``key=value`` overrides.

    Raises:
        ConfigError: an unknown recipe, key or value (named).
    """
    return load_recipe(WarmStartConfig, recipe, overrides, recipe_dir=WARM_START_RECIPE_DIR)


def warm_start_yaml(cfg: WarmStartConfig) -> str:
    """The resolved recipe as YAML: what ``--print-config`` shows and a run folder records."""
    import yaml

    return yaml.safe_dump(asdict(cfg), sort_keys=False)
