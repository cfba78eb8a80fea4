"""``LocalRuntime``: env, rollout and actor in this process (``cluster.runtime=local``).

The runtime interface the training loop drives (``RayRuntime`` implements the same):

    rollout(key) -> Rollout           fresh resets seeded by ``key``, ``rollout.steps_per_rollout`` steps
    update(rollout, targets, it)      one PPO / GRPO update; returns metrics
    sync_weights() -> seconds         actor weights to the rollout policy
    evaluate() -> dict                held-out evaluation (``env.eval``)
    save(run_dir, state) -> Path      an atomic training checkpoint
    close()
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from vla_trainer.build import build_policy, iteration_seed, make_env, make_optimizer
from vla_trainer.checkpoint import restore_rng, rng_state, save_train_checkpoint
from vla_trainer.config.schema import TrainConfig
from vla_trainer.models import EnvGenerators
from vla_trainer.rl.behaviour_cloning import load_bc_demos
from vla_trainer.rl.evaluation import evaluate_recipe
from vla_trainer.rl.rollout import Rollout, collect_rollout
from vla_trainer.rl.update import update_policy


class LocalRuntime:
    name = "local"

    def __init__(self, cfg: TrainConfig, resume_from: Path | None = None, state: dict | None = None):
        self.cfg = cfg
        if cfg.env.enable_offload or cfg.rollout.enable_offload or cfg.actor.enable_offload:
            warnings.warn("enable_offload has no effect with cluster.runtime=local: env, rollout and actor share "
                          "one process and nothing is idle long enough to offload", stacklevel=3)
        if cfg.rollout.pipeline_stage_num > 1:
            warnings.warn(f"rollout.pipeline_stage_num={cfg.rollout.pipeline_stage_num} has no effect with "
                          "cluster.runtime=local: one process cannot overlap generation and simulation; "
                          "the pipelined rollout needs cluster.runtime=ray", stacklevel=3)
        self.policy = build_policy(cfg, resume_from / "model" if resume_from else None)
        self.chunk_size = self.policy.chunk_size
        self.image_size = self.policy.config.image_size
        self.optimizer, self.params = make_optimizer(self.policy, cfg)
        self.ref_policy = build_policy(cfg) if cfg.algorithm.kl_beta > 0 else None
        self.demos = load_bc_demos(cfg, self.policy)
        self.update_gen = torch.Generator().manual_seed(cfg.actor.seed + 1)
        if state is not None:
            self.optimizer.load_state_dict(state["optimizer"])
        restore_rng(self.update_gen, state)
        self.env = make_env(cfg.env.train, self.image_size, group_size=cfg.algorithm.group_size)
        self.num_envs = self.env.num_envs
        self.asset_pack = getattr(self.env, "asset_pack", None)
        self.eval_env = None

    def describe(self) -> str:
        return "colocated (one process)"

    def rollout(self, key: int) -> Rollout:
        cfg, sp = self.cfg, self.cfg.algorithm.sampling_params
        obs, _ = self.env.reset(seed=iteration_seed(cfg.actor.seed, key))
        gens = EnvGenerators.seeded(cfg.actor.seed, (key,), range(self.num_envs))
        rollout, _ = collect_rollout(self.env, self.policy, obs, cfg.rollout.steps_per_rollout // self.chunk_size,
                                     temperature=sp.temperature_train, top_k=sp.top_k or None, generator=gens,
                                     reward_coef=cfg.env.train.reward_coef)
        return rollout

    def update(self, rollout, targets, iteration: int) -> dict:
        return update_policy(self.policy, self.optimizer, self.params, rollout, targets, self.cfg, iteration,
                             self.update_gen, self.ref_policy, demos=self.demos)

    def sync_weights(self) -> float:
        return 0.0  # the rollout policy is the trained one

    def evaluate(self) -> dict:
        cfg = self.cfg
        if self.eval_env is None:
            self.eval_env = make_env(cfg.env.eval, self.image_size, evaluation=True)
        return evaluate_recipe(self.eval_env, self.policy, cfg)

    def save(self, run_dir: Path, state: dict) -> Path:
        return save_train_checkpoint(run_dir, self.cfg, self.policy, self.optimizer, {**state, **rng_state(self.update_gen)})

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()
