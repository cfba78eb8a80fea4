"""The typed settings of one supervised stage (``vla-train sft``, ``train_sft``).

Every field is checked where it is declared (``__post_init__``), so a bad value fails when the
config is made, naming the field and what is allowed, before any demo is read.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Literal, get_args

LRSchedule = Literal["constant", "cosine"]
LR_SCHEDULES: tuple[str, ...] = get_args(LRSchedule)


@dataclass(kw_only=True)
class SFTConfig:
    """Behaviour cloning of demonstrations: AdamW on the target action tokens' mean NLL."""

    steps: int
    """Optimizer steps."""
    batch_size: int
    """Samples per step, drawn from shuffled epochs."""
    lr: float
    """Peak learning rate."""
    seed: int = 0
    """Seeds the minibatch order and torch (a run is deterministic given it)."""
    warmup_steps: int = 0
    """Steps of linear learning-rate warm-up from lr / warmup_steps to lr."""
    lr_schedule: LRSchedule = "constant"
    """After warm-up: ``constant``, or ``cosine`` down to 10 % of lr at the last step."""
    weight_decay: float = 0.0
    """AdamW's decoupled weight decay."""
    max_grad_norm: float = 1.0
    """Gradient clipping by global norm."""
    label_sigma_bins: float = 0.0
    """0: the target bin's NLL. > 0: cross-entropy against a Gaussian over the action bins with this
    standard deviation in bins (a near miss costs less than a far one)."""
    scene_loss_weight: float = 0.0
    """> 0 co-trains a grounding task: a discarded head regresses the expert's scene poses from the
    action slots, weighted by this. Needs demos that record scene poses."""
    first_frame_repeats: int = 1
    """Draw each episode's first frame this many times per epoch (where a scripted reach makes its
    one scene-dependent decision)."""
    release_frame_repeats: int = 1
    """Draw each sample whose action chunk holds the release (the gripper opening after a grasp)
    this many times per epoch."""
    log_every: int = 10
    """Print the mean training loss every N steps (0: never)."""
    eval_every: int | None = None
    """Measure loss, token accuracy and greedy action L1 every N steps (None: before and after only)."""
    eval_samples: int | None = 512
    """Evenly spaced training samples those measurements use (None: all)."""

    def __post_init__(self) -> None:
        def need(ok: bool, name: str, allowed: str) -> None:
            if not ok:
                raise ValueError(f"{name}={getattr(self, name)!r}: {allowed}")

        def is_int(value) -> bool:
            return isinstance(value, int) and not isinstance(value, bool)

        for name in ("steps", "batch_size", "first_frame_repeats", "release_frame_repeats"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 1, name, "an integer >= 1")
        for name in ("warmup_steps", "log_every"):
            need(is_int(getattr(self, name)) and getattr(self, name) >= 0, name, "an integer >= 0")
        need(is_int(self.seed), "seed", "an integer")
        need(self.lr > 0, "lr", "a learning rate > 0")
        need(self.lr_schedule in LR_SCHEDULES, "lr_schedule", f"one of {LR_SCHEDULES}")
        for name in ("weight_decay", "label_sigma_bins", "scene_loss_weight"):
            need(getattr(self, name) >= 0, name, "a number >= 0")
        need(self.max_grad_norm > 0, "max_grad_norm", "a norm > 0")
        for name in ("eval_every", "eval_samples"):
            value = getattr(self, name)
            need(value is None or (is_int(value) and value >= 1), name, "None or an integer >= 1")

    def to_dict(self) -> dict:
        """The settings as plain values (what ``sft_metrics.json`` records under ``settings``)."""
        return asdict(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))
