"""The RL training loop (single process): rollout -> targets -> update -> evaluate -> checkpoint.

    cfg = load_config("cpu_ppo_tiny_put_on_plate", ["runner.max_epochs=2"])
    result = train(cfg)            # result.run_dir has metrics.jsonl, tensorboard/, checkpoints/

Every iteration starts from fresh resets seeded by ``(actor.seed, iteration)`` and runs
``rollout.steps_per_rollout`` env steps per env (auto-reset inside the rollout as configured).
That makes iterations independent of each other's env state, so a resumed run continues
exactly as the uninterrupted one would: the model, optimizer and both random generators
(sampling, minibatch order) are restored from the checkpoint, and the env needs nothing.

Placement: the three components (env, rollout, actor) share this one process; the placement
mode is inferred from ``cluster.component_placement`` and logged.
"""

from __future__ import annotations

import json
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from .advantages import compute_targets, concat_targets
from .algorithms import explained_variance
from .checkpoint import (
    check_resumable,
    fingerprint,
    fingerprint_hash,
    resolve_resume,
    save_model,
    write_atomic_dir,
    write_text_atomic,
)
from .config import check_batch_sizes, placement_mode, to_dict, to_yaml
from .config.schema import EnvSplitConfig, TrainConfig
from .evaluation import evaluate_policy
from .metrics_log import MetricLogger, read_metrics, success_curve
from .rollout import collect_rollout, concat_rollouts
from .update import update_policy

KEEP_CHECKPOINTS = 2


@dataclass
class TrainResult:
    run_dir: Path
    iterations: int
    env_steps: int
    last_eval: dict | None
    checkpoint: Path | None


# ----------------------------------------------------------------------------- building blocks
def build_policy(cfg: TrainConfig, resume_model_dir: Path | None = None):
    """The policy of ``actor.model`` (from a preset or a saved folder), with value head and LoRA
    as configured; ``resume_model_dir`` replaces its weights with a checkpoint's."""
    from .models import VLAPolicy, apply_lora, build_model, load_lora, load_pretrained

    m = cfg.actor.model
    value_type = None
    if cfg.algorithm.loss_type == "actor_critic":
        value_type = cfg.algorithm.value_type or cfg.algorithm.reward_type
    torch.manual_seed(cfg.actor.seed)  # a value head missing from a saved model is initialised from this
    full_resume = resume_model_dir is not None and not m.is_lora
    if full_resume:
        model, tokenizer = load_pretrained(resume_model_dir, value_type=value_type)
    elif m.model_path is not None:
        model, tokenizer = load_pretrained(m.model_path, value_type=value_type)
    else:
        model, tokenizer = build_model(m.preset, seed=cfg.actor.seed, value_type=value_type)
        if tokenizer is None:
            raise ValueError(f"actor.model.preset={m.preset!r} has no built-in tokenizer; set "
                             "actor.model.model_path to a saved checkpoint folder")
    if m.is_lora:
        model = load_lora(model, resume_model_dir) if resume_model_dir is not None else apply_lora(model, m.lora_rank)
    model.eval()
    return VLAPolicy(model, tokenizer, unnorm_key=m.unnorm_key)


def make_env(split: EnvSplitConfig, image_size: int, *, group_size: int = 1, evaluation: bool = False):
    """The vectorized env of ``env.train`` / ``env.eval`` at the model's image size."""
    import gymnasium as gym

    import vla_envs  # noqa: F401  (registers the ids)
    from vla_envs.registry import get_task

    get_task(split.task)  # unknown id: error with close matches, before any work
    kwargs = dict(split.env_kwargs)
    kwargs.update(
        image_size=image_size,
        auto_reset=False if evaluation else split.auto_reset,
        ignore_terminations=split.ignore_terminations,
        use_fixed_reset_state_ids=split.use_fixed_reset_state_ids,
        group_size=1 if evaluation else group_size,
        vectorization=split.vectorization,
    )
    if split.max_episode_steps is not None:
        kwargs["time_limit"] = split.max_episode_steps
    return gym.make(split.task, num_envs=split.total_num_envs, **kwargs)


def iteration_seed(seed: int, iteration: int) -> int:
    """The env reset seed of training iteration ``iteration``."""
    return int(np.random.SeedSequence([seed, iteration]).generate_state(1)[0])


def make_optimizer(policy, cfg: TrainConfig) -> tuple[torch.optim.Optimizer, list[torch.nn.Parameter]]:
    o = cfg.actor.optim
    groups = policy.param_groups(o.lr, o.value_lr)
    params = [p for g in groups for p in g["params"]]
    optimizer = torch.optim.AdamW(groups, betas=(o.adam_beta1, o.adam_beta2), eps=o.adam_eps,
                                  weight_decay=o.weight_decay)
    return optimizer, params


def save_train_checkpoint(run_dir: Path, cfg: TrainConfig, policy, optimizer, state: dict) -> Path:
    """``run_dir/checkpoints/iter_XXXXXX`` (atomic) and the ``latest`` pointer; keeps the newest few."""
    ckpt_root = run_dir / "checkpoints"
    name = f"iter_{state['iteration']:06d}"

    def fill(tmp: Path) -> None:
        save_model(policy, tmp / "model")
        torch.save({**state, "optimizer": optimizer.state_dict()}, tmp / "trainer_state.pt")
        (tmp / "config.yaml").write_text(to_yaml(cfg))
        flat = fingerprint(to_dict(cfg))
        meta = {k: state[k] for k in ("iteration", "env_steps", "asset_pack", "wall_time_s")}
        (tmp / "meta.json").write_text(json.dumps(
            {**meta, "config_fingerprint": fingerprint_hash(flat), "fingerprint_keys": flat}, indent=1, default=str))

    path = write_atomic_dir(ckpt_root / name, fill)
    write_text_atomic(ckpt_root / "latest", name + "\n")
    for old in sorted(ckpt_root.glob("iter_*"))[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)
    return path


def _episode_stats(prefix: str, episodes: dict) -> dict:
    if not episodes or not episodes.get("success_once"):
        return {}
    out = {f"{prefix}/{k}": float(np.mean(v)) for k, v in episodes.items()}
    out[f"{prefix}/episodes"] = len(episodes["success_once"])
    return out


# ----------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, run_dir: str | Path | None = None) -> TrainResult:
    """Runs ``runner.max_epochs`` iterations (or until ``runner.max_wall_minutes``).

    Raises:
        ConfigError: batch sizes that do not fit the model's chunk size.
        ValueError: resuming from a checkpoint of another config.
        NonFiniteLossError: NaN/inf loss or gradient (the last good checkpoint stays as it was).
    """
    run_dir = Path(run_dir or Path(cfg.runner.logger.log_path) / cfg.runner.logger.experiment_name)
    mode = placement_mode(cfg)
    if cfg.env.enable_offload or cfg.rollout.enable_offload or cfg.actor.enable_offload:
        warnings.warn("enable_offload has no effect here: env, rollout and actor share one process "
                      "and nothing is idle long enough to offload", stacklevel=2)

    resume_from = resolve_resume(cfg.runner.resume_dir, run_dir) if cfg.runner.resume_dir else None
    state: dict = {"iteration": 0, "env_steps": 0, "wall_time_s": 0.0}
    if resume_from is not None:
        saved = json.loads((resume_from / "meta.json").read_text())["fingerprint_keys"]
        check_resumable(saved, fingerprint(to_dict(cfg)), resume_from)
        state = torch.load(resume_from / "trainer_state.pt", weights_only=False)

    policy = build_policy(cfg, resume_from / "model" if resume_from else None)
    samples = check_batch_sizes(cfg, policy.chunk_size)
    optimizer, params = make_optimizer(policy, cfg)
    ref_policy = build_policy(cfg) if cfg.algorithm.kl_beta > 0 else None
    rollout_gen = torch.Generator().manual_seed(cfg.actor.seed)
    update_gen = torch.Generator().manual_seed(cfg.actor.seed + 1)
    if resume_from is not None:
        optimizer.load_state_dict(state.pop("optimizer"))
        rollout_gen.set_state(state["rollout_gen"])
        update_gen.set_state(state["update_gen"])
        torch.set_rng_state(state["torch_rng"])  # dropout, if the model has any

    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    if resume_from is not None:  # iterations logged after the checkpoint are run again: drop their records
        kept = [r for r in read_metrics(run_dir) if r["iteration"] <= state["iteration"]]
        write_text_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
    logger = MetricLogger(run_dir, cfg.runner.logger.logger_backends, cfg.runner.logger.experiment_name, to_dict(cfg))
    sp = cfg.algorithm.sampling_params
    top_k = sp.top_k or None
    image_size = policy.config.image_size
    num_chunks = cfg.rollout.steps_per_rollout // policy.chunk_size
    env = make_env(cfg.env.train, image_size, group_size=cfg.algorithm.group_size)
    eval_env = None
    asset_pack = getattr(env, "asset_pack", None)
    state["asset_pack"] = asset_pack
    print(f"run {run_dir}: placement {mode} (one process), task {cfg.env.train.task}"
          f"{f' [{asset_pack} assets]' if asset_pack else ''}, {cfg.env.train.total_num_envs} envs x "
          f"{cfg.rollout.steps_per_rollout} steps = {samples} samples/iteration, model "
          f"{cfg.actor.model.model_path or cfg.actor.model.preset} (chunk {policy.chunk_size}, {image_size} px)"
          + (f", resumed from {resume_from}" if resume_from else ""), flush=True)

    def run_eval() -> dict:
        nonlocal eval_env
        if eval_env is None:
            eval_env = make_env(cfg.env.eval, image_size, evaluation=True)
        res = evaluate_policy(eval_env, policy, cfg.env.eval.num_episodes, seed=cfg.actor.seed,
                              greedy=sp.use_greedy, temperature=sp.temperature_eval, top_k=top_k)
        return {f"eval/{k}": v for k, v in res.items()}

    start_iter = state["iteration"]
    interval = cfg.runner.val_check_interval
    t_start = time.perf_counter() - state["wall_time_s"]
    last_eval, ckpt = None, None
    # a wall-time budget usually ends the run first: then an iteration count is all the bar can show
    total = cfg.runner.max_epochs if cfg.runner.max_wall_minutes is None else None
    iterations = range(start_iter, cfg.runner.max_epochs)
    bar = tqdm(iterations if total else iter(iterations), desc="train", initial=start_iter, total=total,
               disable=not cfg.runner.progress_bar, dynamic_ncols=True, unit="iter")
    try:
        if interval != -1 and start_iter == 0:
            t0 = time.perf_counter()
            last_eval = run_eval()
            logger.log({"iteration": 0, "env_steps": 0, **last_eval, "time/eval": time.perf_counter() - t0})
            bar.write(f"eval before training: success_once {last_eval['eval/success_once']:.3f}  "
                      f"success_at_end {last_eval['eval/success_at_end']:.3f}  "
                      f"({last_eval['eval/num_episodes']} episodes)")
        for it in bar:
            t_iter = time.perf_counter()
            # 1. rollout (generation + simulation), 2. advantages and value targets, per rollout epoch
            rollouts, targets = [], []
            for k in range(cfg.algorithm.rollout_epoch):
                obs, _ = env.reset(seed=iteration_seed(cfg.actor.seed, it * cfg.algorithm.rollout_epoch + k))
                r, _ = collect_rollout(env, policy, obs, num_chunks, temperature=sp.temperature_train, top_k=top_k,
                                       generator=rollout_gen, reward_coef=cfg.env.train.reward_coef)
                rollouts.append(r)
                targets.append(compute_targets(r, cfg.algorithm, cfg.algorithm.group_size))
            rollout, targets = concat_rollouts(rollouts), concat_targets(targets)
            t_rollout = time.perf_counter() - t_iter
            # 3. update
            t0 = time.perf_counter()
            metrics = update_policy(policy, optimizer, params, rollout, targets, cfg, it, update_gen, ref_policy)
            t_update = time.perf_counter() - t0
            state["iteration"] = it + 1
            frames = env.num_envs * cfg.rollout.steps_per_rollout * cfg.algorithm.rollout_epoch
            state["env_steps"] += frames
            record = {"iteration": it + 1, "env_steps": state["env_steps"], **metrics, **targets.stats,
                      **_episode_stats("train", rollout.episodes),
                      "train/reward_per_step": float(rollout.rewards.sum() / rollout.valid.sum().clamp(min=1)),
                      "time/rollout": t_rollout, "time/generation": rollout.timing["generation"],
                      "time/simulation": rollout.timing["simulation"], "time/update": t_update}
            if targets.returns is not None:
                record["critic/explained_variance"] = float(explained_variance(targets.old_values, targets.returns,
                                                                               targets.mask))
            record["time/iteration"] = time.perf_counter() - t_iter
            record["throughput/env_frames_per_s"] = frames / record["time/iteration"]
            # 4. evaluation, checkpoint
            last = it + 1 == cfg.runner.max_epochs
            out_of_time = (cfg.runner.max_wall_minutes is not None
                           and time.perf_counter() - t_start >= 60 * cfg.runner.max_wall_minutes)
            if interval != -1 and ((it + 1) % interval == 0 or last or out_of_time):
                t0 = time.perf_counter()
                last_eval = run_eval()
                record.update(last_eval, **{"time/eval": time.perf_counter() - t0})
            state["wall_time_s"] = time.perf_counter() - t_start
            record["time/wall"] = state["wall_time_s"]
            logger.log(record)
            periodic = cfg.runner.save_interval != -1 and (it + 1) % cfg.runner.save_interval == 0
            if periodic or last or out_of_time:
                ckpt = save_train_checkpoint(run_dir, cfg, policy, optimizer, {
                    **state, "rollout_gen": rollout_gen.get_state(), "update_gen": update_gen.get_state(),
                    "torch_rng": torch.get_rng_state()})
            bar.set_postfix({k: f"{record[v]:.2f}" for k, v in (
                ("succ", "train/success_once"), ("ret", "train/return"), ("eval", "eval/success_once"),
                ("fps", "throughput/env_frames_per_s")) if v in record})
            if out_of_time:
                bar.write(f"stopping after iteration {it + 1}: runner.max_wall_minutes="
                          f"{cfg.runner.max_wall_minutes} reached")
                break
    finally:
        bar.close()
        logger.close()
        env.close()
        if eval_env is not None:
            eval_env.close()
        curve = success_curve(read_metrics(run_dir), run_dir / "success_curve.png",
                              title=f"{cfg.runner.logger.experiment_name}: {cfg.env.eval.task}")
        if curve is not None:
            print(f"success curve: {curve}", flush=True)
    return TrainResult(run_dir, state["iteration"], state["env_steps"], last_eval, ckpt)
