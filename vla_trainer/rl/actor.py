"""The actor: the policy being trained and everything its update needs, built the same way by both
runtimes (``LocalRuntime`` holds one in-process; ``RayRuntime`` one per ``ActorWorker`` rank).

Build order is fixed, because the models' initial weights and the update's generator depend on it:
policy (from the checkpoint being resumed, or the recipe's model), optimizer, the frozen reference
policy when ``algorithm.kl_beta > 0``, the behaviour-cloning demos when ``algorithm.bc_coef > 0``,
then the optimizer state and the update generator's state of the resumed checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import torch

from vla_trainer.build import build_policy, make_optimizer
from vla_trainer.checkpoint import restore_rng, rng_state, save_train_checkpoint
from vla_trainer.config.schema import TrainConfig
from vla_trainer.rl.behaviour_cloning import load_bc_demos
from vla_trainer.rl.rollout import Rollout
from vla_trainer.rl.targets import Targets
from vla_trainer.rl.update import update_policy


class Actor:
    """The trained policy, its optimizer, reference policy, demos and update generator."""

    def __init__(self, cfg: TrainConfig, resume_from: str | Path | None = None, state: dict | None = None,
                 device: str | None = None):
        """
        Args:
            cfg: the recipe.
            resume_from: a training checkpoint folder to continue (its ``model/`` is loaded).
            state: that checkpoint's trainer state (optimizer and generator states), if resuming.
            device: where the policy lives (the build default when None).
        """
        self.cfg = cfg
        self.policy = build_policy(cfg, Path(resume_from) / "model" if resume_from else None, device=device)
        self.optimizer, self.params = make_optimizer(self.policy, cfg)
        self.ref_policy = build_policy(cfg, device=device) if cfg.algorithm.kl_beta > 0 else None
        self.demos = load_bc_demos(cfg, self.policy)  # every rank draws the same indices; rank 0 adds the term
        self.update_gen = torch.Generator().manual_seed(cfg.actor.seed + 1)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        restore_rng(self.update_gen, state)

    def update(self, rollout: Rollout, targets: Targets, iteration: int, *, rank: int = 0, world_size: int = 1,
               all_reduce: Callable | None = None) -> dict:
        """One PPO / GRPO update (``rl.update.update_policy``); returns its metrics."""
        return update_policy(self.policy, self.optimizer, self.params, rollout, targets, self.cfg, iteration,
                             self.update_gen, self.ref_policy, demos=self.demos, rank=rank, world_size=world_size,
                             all_reduce=all_reduce)

    def save(self, run_dir: Path, state: dict) -> Path:
        """An atomic training checkpoint of the policy, optimizer and update generator, with ``state``."""
        return save_train_checkpoint(Path(run_dir), self.cfg, self.policy, self.optimizer,
                                     {**state, **rng_state(self.update_gen)})
