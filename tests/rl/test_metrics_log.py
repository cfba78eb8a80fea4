"""The metric logger's backends: metrics.jsonl, TensorBoard, and W&B without an account (offline,
no login prompt)."""

from __future__ import annotations

import pytest

from vla_trainer.metrics_log import MetricLogger, read_metrics


def test_wandb_without_api_key_logs_offline_instead_of_prompting(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # no ~/.netrc: not logged in
    monkeypatch.setenv("WANDB_SILENT", "true")
    with pytest.warns(UserWarning, match="no W&B API key.*offline"):
        log = MetricLogger(tmp_path / "run", ["tensorboard", "wandb"], "exp", {"actor": {"seed": 1}})
    log.log({"iteration": 1, "env_steps": 8, "actor/policy_loss": 0.5, "eval/success_once": float("nan")})
    log.close()
    assert read_metrics(tmp_path / "run")[0]["actor/policy_loss"] == 0.5
    runs = list((tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb"))
    assert list((tmp_path / "run" / "tensorboard").glob("events.out.tfevents.*"))


def test_a_resumed_run_logs_to_the_same_wandb_run_and_a_new_run_to_another(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))

    def run_id(purge_after_step):
        log = MetricLogger(tmp_path / "run", ["wandb"], "exp", purge_after_step=purge_after_step)
        log.log({"iteration": 1, "env_steps": 8, "actor/policy_loss": 0.5})
        run = log.wandb.id
        log.close()
        return run

    first = run_id(-1)
    assert run_id(8) == first  # resumed from the checkpoint at 8 env steps
    again = run_id(-1)  # a new run in the folder (its earlier checkpoints removed)
    assert again != first and run_id(0) == again
    folders = sorted(p.name for p in (tmp_path / "run" / "wandb").glob("offline-run-*"))
    assert {f.split("-")[3] for f in folders} == {first, again}, folders  # offline-run-<time>-<id>[-n]


def test_tensorboard_drops_what_a_resumed_run_logs_again_and_what_a_dead_run_left(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    def logged(purge_after_step, records):
        log = MetricLogger(tmp_path / "run", ["tensorboard"], "exp", purge_after_step=purge_after_step)
        for r in records:
            log.log(r)
        log.close()
        acc = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
        acc.Reload()
        return [(e.step, e.value) for e in acc.Scalars("actor/policy_loss")]

    first = [{"iteration": i, "env_steps": 8 * i, "actor/policy_loss": float(i)} for i in (1, 2)]
    assert logged(-1, first) == [(8, 1.0), (16, 2.0)]
    # resumed from the checkpoint of iteration 1 (8 env steps): iteration 2 is logged again, once
    assert logged(8, [{"iteration": 2, "env_steps": 16, "actor/policy_loss": 5.0}]) == [(8, 1.0), (16, 5.0)]
    # a new run in the folder: nothing of the earlier writers is shown
    assert logged(-1, [{"iteration": 1, "env_steps": 8, "actor/policy_loss": 7.0}]) == [(8, 7.0)]


def test_train_episode_stats_leave_out_and_count_the_episodes_a_simulator_crash_cut():
    from vla_trainer.rl.rollout import CRASHED_EPISODES, LATE_EPISODES
    from vla_trainer.runner import _episode_stats

    stats = _episode_stats("train", {"success_once": [1.0, 0.0, 1.0], "length": [4.0, 10.0, 6.0],
                                     CRASHED_EPISODES: [1.0, 1.0], LATE_EPISODES: [1.0]})
    assert stats == {"train/success_once": 2 / 3, "train/length": 20 / 3, "train/episodes": 3,
                     "train/crashed_episodes": 2, "train/late_episodes": 1}
    assert _episode_stats("train", {"success_once": [], CRASHED_EPISODES: [1.0]}) == {"train/crashed_episodes": 1}
    assert _episode_stats("train", {}) == {}


@pytest.mark.parametrize("chunk", [1, 2])
def test_train_success_counts_only_episodes_that_could_end_either_way_in_the_rollout(chunk):
    """With auto-reset, an episode that starts after ``horizon - time_limit`` ends in the rollout
    only by succeeding early; counting it counted the successes of late starts and not their
    failures (a policy that succeeds half the time showed 0.8). Here env 0 succeeds at every step,
    env 1 never, over one time limit (4 steps)."""
    import numpy as np
    from toy_env import ToyEnv

    from vla_envs.core.serial import SerialBackend
    from vla_envs.core.vector_env import ChunkVectorEnv
    from vla_trainer.rl.rollout import LATE_EPISODES, finished_episodes

    env = ChunkVectorEnv(SerialBackend([lambda: ToyEnv(4)] * 2), auto_reset=True, chunk_reset="immediate",
                         skip_finished_actions=False)
    actions = np.zeros((2, chunk, 7), np.float32)
    actions[0, :, 6] = 1.0  # env 0's gripper closes: success, the episode ends
    env.reset(seed=0)
    success, late = [], 0
    for t in range(4 // chunk):
        episodes = finished_episodes(env.chunk_step(actions), t * chunk, horizon=4, time_limit=4)
        success += episodes.get("success_once", [])
        late += len(episodes.get(LATE_EPISODES, []))
    env.close()
    assert sorted(success) == [0.0, 1.0] and late == 3  # each env's first episode; env 0's next three left out
