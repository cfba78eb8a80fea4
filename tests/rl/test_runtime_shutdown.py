"""Ctrl-C during a Ray run (`vla-train ... cluster.runtime=ray`): exit code 130, the message on
how to resume, and no process left behind (driver, Ray's own daemons, workers)."""

from __future__ import annotations

import json
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]

# one device: one worker per component (each starts its own Python with torch); what is checked is the
# run's stop, which is the same for any number of them
OVERRIDES = ["cluster.runtime=ray", "cluster.num_devices=1", "env.train.total_num_envs=2",
             "rollout.steps_per_rollout=16", "actor.global_batch_size=4", "actor.micro_batch_size=2",
             "runner.progress_bar=false", "runner.val_check_interval=-1", "runner.max_epochs=100",
             "runner.save_interval=1"]


def _iterations(run: Path) -> int:
    path = run / "metrics.jsonl"
    if not path.exists():
        return 0
    return sum(1 for line in path.read_text().splitlines() if json.loads(line)["iteration"] > 0)


@pytest.mark.reliability(fault="Ctrl-C during a Ray run; SIGTERM to its trainer or to all its processes (a "
                         "scheduler's preemption)", cases=1,
                         outcome="stopped: exit 130 / 143, no process left, the last checkpoint whole")
@pytest.mark.parametrize("stop", ["ctrl_c", "sigterm", "sigterm_group"])
def test_ctrl_c_or_sigterm_stops_a_ray_run_and_leaves_no_process(tmp_path, stop):
    """Ctrl-C reaches the whole process group, as in a terminal; SIGTERM only the trainer, as ``kill PID``
    sends it, or every process of the run (Ray's GCS and raylet too), as ``kill -TERM -PGID`` or a
    scheduler that signals the whole job. ``ray.init`` installs a SIGTERM handler of its own
    (``sys.exit``), which must not replace the trainer's; and with Ray's GCS gone, closing must not ask
    it anything (Ray would wait 60 s for it, then end the trainer with exit 1)."""
    ray_tmp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # Ray's socket paths must stay under 108 bytes
    env = {**os.environ, "VLA_ENVS_ASSET_DIR": str(tmp_path / "assets"), "HF_HUB_OFFLINE": "1", "RAY_TMPDIR": ray_tmp}
    run = tmp_path / "run"
    cli = Path(sys.executable).with_name("vla-train")
    proc = subprocess.Popen([str(cli), "--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(run), *OVERRIDES],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True,  # its own process group, as a terminal's job
                            # a terminal's job gets Ctrl-C even if this process ignores SIGINT (inherited)
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.time() + 300
        latest_file = run / "checkpoints" / "latest"
        # the first checkpoint, not only the first record: an iteration's record is logged before its
        # checkpoint is saved, and a stop between the two leaves no checkpoint to check
        while not latest_file.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert _iterations(run) >= 1 and latest_file.exists(), "no iteration checkpointed in 300 s"
        family = psutil.Process(proc.pid).children(recursive=True)
        assert any("raylet" in " ".join(p.cmdline()) for p in family), "no Ray started by the run"
        if stop == "ctrl_c":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in the terminal does
        elif stop == "sigterm_group":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=50)  # under Ray's 60 s wait for a GCS that is gone
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert proc.returncode == {"ctrl_c": 130, "sigterm": 143, "sigterm_group": 143}[stop], out[-3000:]
    said = "interrupted" if stop == "ctrl_c" else "terminated"
    assert f"{said}: envs and workers closed; resume with runner.resume_dir=auto" in out, out[-3000:]
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, [" ".join(p.cmdline())[:120] for p in alive]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert (run / "checkpoints" / latest / "model").is_dir()  # the last checkpoint is whole


@pytest.mark.reliability(fault="SIGTERM to a training run (a scheduler's preemption)", cases=1,
                         outcome="stopped: exit 143, no process or /dev/shm segment left, the last checkpoint whole")
def test_sigterm_stops_a_local_run_like_ctrl_c_and_leaves_nothing_behind(tmp_path):
    env = {**os.environ, "VLA_ENVS_ASSET_DIR": str(tmp_path / "assets"), "HF_HUB_OFFLINE": "1"}
    run = tmp_path / "run"
    cli = Path(sys.executable).with_name("vla-train")
    local = [o for o in OVERRIDES if not o.startswith("cluster.")]  # the pool of env worker processes
    proc = subprocess.Popen([str(cli), "--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(run), *local],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 300
        latest = run / "checkpoints" / "latest"
        while not latest.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.5)
        assert proc.poll() is None, proc.stdout.read()
        assert latest.exists(), "no checkpoint written in 300 s"
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 2, "no env worker processes"
        ours = f"vla_{proc.pid}_"  # the pool's blocks are named for the process that made them
        assert any(n.startswith(ours) for n in os.listdir("/dev/shm")), "the pool's blocks are not in /dev/shm"
        proc.send_signal(signal.SIGTERM)  # to the trainer alone, as `kill PID` or a scheduler does
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    assert "terminated: envs and workers closed; resume with runner.resume_dir=auto" in out
    _, alive = psutil.wait_procs(family, timeout=30)
    assert not alive, [" ".join(p.cmdline())[:120] for p in alive]
    assert [n for n in os.listdir("/dev/shm") if n.startswith(ours)] == []
    assert "leaked shared_memory" not in out
    latest = (run / "checkpoints" / "latest").read_text().strip()
    assert (run / "checkpoints" / latest / "model").is_dir()
