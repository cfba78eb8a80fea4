"""The Ray runtime on the real CPU ManiSkill PutOnPlate task (tiny models), one Ray session for
the module: two training iterations in every placement (split, pipelined, offloaded), from a warm
start that reads the robot state and with the behaviour-cloning term on, give the same weights as
one process; a dead worker is restarted under ``cluster.max_restarts`` and the interrupted rollout
runs again to the same data, and past it stops the run with its error, leaving no process behind."""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time

import numpy as np
import pytest
import torch
from shipped_paths import SHIPPED_WARM_START

from vla_trainer.config import load_config
from vla_trainer.metrics_log import read_metrics
from vla_trainer.models import load_pretrained
from vla_trainer.runner import train
from vla_trainer.runtime.errors import WorkerFailed
from vla_trainer.runtime.ray_runtime import RayRuntime

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]

BASE = ["env.train.total_num_envs=4", "rollout.steps_per_rollout=16", "actor.global_batch_size=8",
        "actor.micro_batch_size=2", "runner.progress_bar=false", "env.train.vectorization=serial",
        "env.eval.total_num_envs=2", "env.eval.num_episodes=2", "env.eval.vectorization=serial",
        "env.eval.max_episode_steps=16", "runner.val_check_interval=-1", "runner.max_epochs=2"]
RAY = ["cluster.runtime=ray", "cluster.num_devices=4"]
LAYOUTS = {  # the paper's three modes, as 4 CPU devices on 2 cores
    "disaggregated": ["cluster.component_placement.env=0", "cluster.component_placement.rollout=1",
                      "cluster.component_placement.actor=2-3"],
    "hybrid_pipe2": ["cluster.component_placement.env=0-1", "cluster.component_placement.rollout=2-3",
                     "cluster.component_placement.actor=0-3", "rollout.pipeline_stage_num=2"],
    "colocated_offload": ["actor.enable_offload=true", "rollout.enable_offload=true", "env.enable_offload=true"],
}


@pytest.fixture(scope="module", autouse=True)
def ray_session(tmp_path_factory):
    import ray

    saved = {k: os.environ.get(k) for k in ("VLA_ENVS_ASSET_DIR", "HF_HUB_OFFLINE")}
    os.environ["VLA_ENVS_ASSET_DIR"] = str(tmp_path_factory.mktemp("assets"))
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("RAY_worker_register_timeout_seconds", "900")  # as RayRuntime sets it for its own Ray
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    ray.init(num_cpus=2, include_dashboard=False, logging_level="WARNING", _temp_dir=ray_tmp)
    yield
    ray.shutdown()
    shutil.rmtree(ray_tmp, ignore_errors=True)
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _wait_gone(pids, seconds=20.0):
    deadline = time.time() + seconds
    while time.time() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if _alive(p)]


def _final_weights(run):
    model, _ = load_pretrained(run / "checkpoints" / "iter_000002" / "model")
    return model.state_dict()


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """``BASE`` from the shipped warm start, which reads the robot state (env workers must hand each
    step's state through the pipeline to the rollout and the update, as one process keeps it),
    with the behaviour-cloning term on (``algorithm.bc_coef``: each actor rank draws the demo indices
    and one adds the term). A placement that broke either would end at other weights."""
    from synthetic_demos import write_demos

    demos = write_demos(tmp_path_factory.mktemp("demos") / "demos", state_dim=16)
    return BASE + [f"actor.model.model_path={SHIPPED_WARM_START}", "algorithm.bc_coef=0.5", "algorithm.bc_batch_size=4",
                   f"algorithm.bc_demo_dirs=[{demos}]"]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory, recipe):
    run = tmp_path_factory.mktemp("local") / "run"
    train(load_config("cpu_ppo_tiny_put_on_plate", recipe), run_dir=run)
    return run


@pytest.mark.parametrize("mode", list(LAYOUTS))
def test_two_iterations_in_every_placement_match_one_process(mode, one_process_run, recipe, tmp_path):
    """PPO with the behaviour-cloning term: the placement's actor ranks (two in the colocated and
    hybrid placements on 2 cores, one in the disaggregated) train to the one-process weights, and
    the term was really there."""
    result = train(load_config("cpu_ppo_tiny_put_on_plate", recipe + RAY + LAYOUTS[mode]), run_dir=tmp_path / "run")
    assert result.iterations == 2
    expected, got = _final_weights(one_process_run), _final_weights(result.run_dir)
    initial, _ = load_pretrained(SHIPPED_WARM_START)
    changed = [k for k, v in initial.state_dict().items() if not torch.equal(got[k], v)]
    assert changed, "training changed no parameter"
    for k in expected:
        torch.testing.assert_close(got[k], expected[k], atol=2e-5, rtol=1e-4, msg=f"{mode}: {k}")
    records = read_metrics(result.run_dir)
    assert records[-1]["time/weight_sync"] > 0 and records[-1]["throughput/env_frames_per_s"] > 0
    bc_nll = [r["actor/bc_nll"] for r in records if "actor/bc_nll" in r]
    assert len(bc_nll) == 2 and all(x > 0 for x in bc_nll)


def _assert_same_rollout(got, expected):
    assert torch.equal(got.action_token_ids, expected.action_token_ids)
    np.testing.assert_array_equal(got.image, expected.image)
    for name in ("rewards", "terminated", "truncated", "valid"):
        assert torch.equal(getattr(got, name), getattr(expected, name)), name
    torch.testing.assert_close(got.log_probs, expected.log_probs, atol=1e-5, rtol=0)


@pytest.mark.reliability(fault='a Ray env or rollout worker dies (SIGKILL), mid-rollout or between', cases=3,
                         outcome='survived: restarted with the current weights, the rollout run again to the '
                                 'same data; past cluster.max_restarts the run stops naming it, the checkpoint kept')
def test_dead_workers_are_restarted_and_the_interrupted_rollout_runs_again_unchanged(tmp_path):
    from vla_trainer.rl.targets import compute_targets

    cfg = load_config("cpu_ppo_tiny_put_on_plate", BASE + RAY + LAYOUTS["disaggregated"] + ["cluster.max_restarts=2"])
    rt = RayRuntime(cfg)
    seen = []
    try:
        # one update first, so a restarted rollout worker (built from the initial model) must be sent
        # the trained weights for its actions and log-probs to match
        r0 = rt.rollout(7)
        rt.update(r0, compute_targets(r0, cfg.algorithm, cfg.algorithm.group_size), 0)
        rt.sync_weights()
        expected = rt.rollout(8)
        env_pid, rollout_pid = rt.worker_pids[:2]
        seen += rt.pids()

        # the env worker dies mid-rollout: stopped first, so the rollout is surely in flight when it dies
        os.kill(env_pid, signal.SIGSTOP)
        out = {}
        runner = threading.Thread(target=lambda: out.setdefault("rollout", rt.rollout(8)))
        with pytest.warns(RuntimeWarning, match=r"rollout: env worker 0 \(pid \d+ -> \d+\) died and was restarted"):
            runner.start()
            time.sleep(1.0)
            os.kill(env_pid, signal.SIGKILL)
            runner.join(timeout=300)
        _assert_same_rollout(out["rollout"], expected)

        # the rollout worker dies between iterations
        os.kill(rollout_pid, signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match=r"rollout worker 0 .* restarted \(2 of cluster.max_restarts=2\)"):
            _assert_same_rollout(rt.rollout(8), expected)
        assert rt.workers_replaced == 2
        seen += rt.pids()
        assert env_pid not in rt.worker_pids and rollout_pid not in rt.worker_pids

        # a third death is past the budget: the run stops, naming it, and the last checkpoint is whole
        ckpt = rt.save(tmp_path, {"iteration": 1, "env_steps": 64, "wall_time_s": 1.0, "asset_pack": "procedural"})
        os.kill(rt.worker_pids[0], signal.SIGKILL)
        with pytest.raises(WorkerFailed, match=r"env worker 0 .*cluster.max_restarts=2 restarts allowed, 3 needed"):
            rt.rollout(8)
    finally:
        rt.close()
    assert _wait_gone(set(seen)) == []

    load_pretrained(ckpt / "model")
