"""The RL training loop: rollout -> targets -> update -> weight sync -> evaluate -> checkpoint.

    cfg = load_config("cpu_ppo_tiny_put_on_plate", ["runner.max_epochs=2"])
    result = train(cfg)            # result.run_dir has metrics.jsonl, tensorboard/, checkpoints/

Every iteration starts from fresh resets seeded by ``(actor.seed, iteration)`` and runs
``rollout.steps_per_rollout`` env steps per env (auto-reset inside the rollout as configured);
each env samples its actions from its own generator seeded the same way. That makes iterations
independent of each other's env and sampling state, so a resumed run continues exactly as the
uninterrupted one would: the model, optimizer and minibatch-order generator are restored from
the checkpoint, and the env needs nothing.

Where the work runs is the runtime's business (``vla_trainer.runtime``): ``cluster.runtime=local``
keeps env, rollout and actor in this process; ``ray`` places them as Ray workers by
``cluster.component_placement`` with ``rollout.pipeline_stage_num`` pipeline stages. The loop
below is the same for both.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from vla_trainer.algorithms import explained_variance
from vla_trainer.build import full_model_dir, rollout_key
from vla_trainer.checkpoint import (latest_checkpoint, read_train_state, remove_leftovers, resolve_resume,
                                    run_folder_lock, set_aside_newer_checkpoints, write_text_atomic)
from vla_trainer.config import check_batch_sizes, to_dict, to_yaml
from vla_trainer.config.schema import TrainConfig
from vla_trainer.metrics_log import MetricLogger, read_metrics, success_curve
from vla_trainer.rl.rollout import CRASHED_EPISODES, LATE_EPISODES, concat_rollouts
from vla_trainer.rl.targets import compute_targets, concat_targets

@dataclass
class TrainResult:
    run_dir: Path
    iterations: int
    env_steps: int
    last_eval: dict | None
    checkpoint: Path | None


def _episode_stats(prefix: str, episodes: dict) -> dict:
    """Means over the finished episodes, their count, and the counts of those left out of the means
    (a simulator crash cut them; they started too late to reach the time limit in the rollout),
    when any."""
    out = {f"{prefix}/{k}": len(episodes[k]) for k in (CRASHED_EPISODES, LATE_EPISODES) if episodes.get(k)}
    if episodes.get("success_once"):
        out |= {f"{prefix}/{k}": float(np.mean(v)) for k, v in episodes.items()
                if k not in (CRASHED_EPISODES, LATE_EPISODES)}
        out[f"{prefix}/episodes"] = len(episodes["success_once"])
    return out


# ----------------------------------------------------------------------------- the loop
def train(cfg: TrainConfig, run_dir: str | Path | None = None) -> TrainResult:
    """Runs ``runner.max_epochs`` iterations (or until ``runner.max_wall_minutes``).

    Raises:
        ConfigError: batch sizes that do not fit the model's chunk size, a placement that does
            not fit the devices.
        ValueError: resuming from a checkpoint of another config; ``run_dir`` is a file, or holds an
            earlier run's checkpoints and ``runner.resume_dir`` is not set.
        NonFiniteLossError: NaN/inf loss or gradient (the last good checkpoint stays as it was).
        WorkerError: a Ray worker died (its error is in the message).
        ValueError: another process is training in ``run_dir``.
        FileNotFoundError: ``actor.model.model_path`` names no model to start from.
    """
    m = cfg.actor.model
    if m.model_path is not None and not (cfg.runner.resume_dir and not m.is_lora):  # a full resume loads its own
        full_model_dir(m.model_path)  # said at once, before the run folder, the envs and the workers
    run_dir = Path(run_dir or Path(cfg.runner.logger.log_path) / cfg.runner.logger.experiment_name)
    if run_dir.exists() and not run_dir.is_dir():
        raise ValueError(f"the run folder {run_dir} is a file; give a folder (--run-dir)")
    try:  # before the envs and the model: a folder that cannot be made is said at once
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(f"the run folder {run_dir} cannot be made: {e.strerror or e} (--run-dir)") from None
    with run_folder_lock(run_dir):
        return _train_in(cfg, run_dir)


def _train_in(cfg: TrainConfig, run_dir: Path) -> TrainResult:
    """``train`` in a run folder this process holds."""
    from vla_trainer.runtime import make_runtime

    if (run_dir / "checkpoints").is_dir():  # a save killed between its two renames hid the checkpoint: put it back
        remove_leftovers(run_dir / "checkpoints")
    resume_from = resolve_resume(cfg.runner.resume_dir, run_dir) if cfg.runner.resume_dir else None
    earlier = latest_checkpoint(run_dir)
    if earlier is not None and (resume_from is None or resume_from.resolve().parent != earlier.resolve().parent):
        # a new run there, or another run's continuation, would mix its records and checkpoints with these
        raise ValueError(f"{run_dir} holds an earlier run (its latest checkpoint: {earlier.name}); continue it with "
                         "runner.resume_dir=auto, or give a new folder (--run-dir)"
                         + (f" to continue {resume_from} in" if resume_from is not None else ""))
    state: dict = {"iteration": 0, "env_steps": 0, "wall_time_s": 0.0}
    if resume_from is not None:
        state = read_train_state(resume_from, cfg)
        budget_s = None if cfg.runner.max_wall_minutes is None else 60 * cfg.runner.max_wall_minutes
        if budget_s is not None and state["wall_time_s"] >= budget_s:  # spent: not one iteration more
            print(f"run {run_dir}: runner.max_wall_minutes={cfg.runner.max_wall_minutes} was reached before "
                  f"{resume_from.name} ({state['wall_time_s'] / 60:.1f} min trained); nothing to do", flush=True)
            return TrainResult(run_dir, state["iteration"], state["env_steps"], None, resume_from)
        aside = set_aside_newer_checkpoints(run_dir, resume_from)
        if aside is not None:
            print(f"run {run_dir}: continuing from {resume_from.name}, not the latest checkpoint: the newer ones and "
                  f"the records up to them are kept in {aside}", flush=True)

    runtime = make_runtime(cfg, resume_from, state if resume_from else None)
    for key in ("optimizer", "update_gen", "torch_rng", "rollout_gen"):
        state.pop(key, None)  # the runtime restored them where the model lives
    try:
        samples = check_batch_sizes(cfg, runtime.chunk_size)
        return _loop(cfg, run_dir, runtime, state, resume_from, samples)
    finally:
        runtime.close()


def _loop(cfg: TrainConfig, run_dir: Path, runtime, state: dict, resume_from: Path | None,
          samples: int) -> TrainResult:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(to_yaml(cfg))
    # iterations logged after the checkpoint are run again: drop their records (a new run: a run that
    # died before its first checkpoint may have left some)
    kept = [r for r in read_metrics(run_dir) if r["iteration"] <= state["iteration"]] if resume_from else []
    if kept or (run_dir / "metrics.jsonl").exists():
        write_text_atomic(run_dir / "metrics.jsonl", "".join(json.dumps(r) + "\n" for r in kept))
    logger = MetricLogger(run_dir, cfg.runner.logger.logger_backends, cfg.runner.logger.experiment_name, to_dict(cfg),
                          purge_after_step=state["env_steps"] if resume_from else -1)
    asset_pack = runtime.asset_pack
    state["asset_pack"] = asset_pack
    print(f"run {run_dir}: placement {runtime.describe()}, task {cfg.env.train.task}"
          f"{f' [{asset_pack} assets]' if asset_pack else ''}, {cfg.env.train.total_num_envs} envs x "
          f"{cfg.rollout.steps_per_rollout} steps = {samples} samples/iteration, model "
          f"{cfg.actor.model.model_path or cfg.actor.model.preset} (chunk {runtime.chunk_size}, "
          f"{runtime.image_size} px)" + (f", resumed from {resume_from}" if resume_from else ""), flush=True)

    def run_eval() -> dict:
        return {f"eval/{k}": v for k, v in runtime.evaluate().items()}

    start_iter = state["iteration"]
    interval = cfg.runner.val_check_interval
    t_start = time.perf_counter() - state["wall_time_s"]
    last_eval, ckpt = None, resume_from  # a finished run resumed trains nothing: its checkpoint stands
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
                r = runtime.rollout(rollout_key(it, cfg.algorithm.rollout_epoch, k))
                rollouts.append(r)
                targets.append(compute_targets(r, cfg.algorithm, cfg.algorithm.group_size))
            rollout, targets = concat_rollouts(rollouts), concat_targets(targets)
            t_rollout = time.perf_counter() - t_iter
            # 3. update, then the rollout policy gets the new weights
            t0 = time.perf_counter()
            metrics = runtime.update(rollout, targets, it)
            t_update = time.perf_counter() - t0
            t_sync = runtime.sync_weights()
            state["iteration"] = it + 1
            frames = runtime.num_envs * cfg.rollout.steps_per_rollout * cfg.algorithm.rollout_epoch
            state["env_steps"] += frames
            record = {"iteration": it + 1, "env_steps": state["env_steps"], **metrics, **targets.stats,
                      **_episode_stats("train", rollout.episodes),
                      "train/reward_per_step": rollout.reward_per_step(),
                      "time/rollout": t_rollout, "time/generation": rollout.timing["generation"],
                      "time/simulation": rollout.timing["simulation"], "time/update": t_update,
                      "time/weight_sync": t_sync}
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
                ckpt = runtime.save(run_dir, state)
            bar.set_postfix({k: f"{record[v]:.2f}" for k, v in (
                ("succ", "train/success_once"), ("grasp", "train/grasped_once"), ("ret", "train/return"),
                ("eval", "eval/success_once"),
                ("fps", "throughput/env_frames_per_s")) if v in record})
            if out_of_time:
                bar.write(f"stopping after iteration {it + 1}: runner.max_wall_minutes="
                          f"{cfg.runner.max_wall_minutes} reached")
                break
    finally:
        bar.close()
        logger.close()
        curve = success_curve(read_metrics(run_dir), run_dir / "success_curve.png",
                              title=f"{cfg.runner.logger.experiment_name}: {cfg.env.eval.task}")
        if curve is not None:
            print(f"success curve: {curve}", flush=True)
    return TrainResult(run_dir, state["iteration"], state["env_steps"], last_eval, ckpt)
