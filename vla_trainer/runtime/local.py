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

from vla_trainer.build import iteration_seed, make_env
from vla_trainer.config.schema import TrainConfig
from vla_trainer.models import EnvGenerators
from vla_trainer.rl.actor import Actor
from vla_trainer.rl.evaluation import evaluate_recipe
from vla_trainer.rl.rollout import Rollout, collect_rollout


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
        self.actor = Actor(cfg, resume_from, state)
        self.policy = self.actor.policy  # the rollout policy is the trained one
        self.chunk_size = self.policy.chunk_size
        self.image_size = self.policy.config.image_size
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
        return self.actor.update(rollout, targets, iteration)

    def sync_weights(self) -> float:
        return 0.0  # the rollout policy is the trained one

    def evaluate(self) -> dict:
        cfg = self.cfg
        if self.eval_env is None:
            self.eval_env = make_env(cfg.env.eval, self.image_size, evaluation=True)
        return evaluate_recipe(self.eval_env, self.policy, cfg)

    def save(self, run_dir: Path, state: dict) -> Path:
        return self.actor.save(run_dir, state)

    def close(self) -> None:
        self.env.close()
        if self.eval_env is not None:
            self.eval_env.close()
