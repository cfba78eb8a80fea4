"""Training checkpoints under faults: the disk fills up mid-save, the trainer is killed (SIGKILL)
mid-save. Each time the last whole checkpoint stays loadable and ``latest`` names it."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_trainer.checkpoint import CheckpointWriteError, latest_checkpoint, save_train_checkpoint
from vla_trainer.config import load_config



# Builds the tiny preset with an optimizer that has state, and saves iterations start, start+1, ...
# (the subprocess below runs the same code and is killed while it writes).
SAVER = textwrap.dedent("""
    import sys
    from pathlib import Path

    import torch

    from vla_trainer.build import build_policy
    from vla_trainer.checkpoint import save_train_checkpoint
    from vla_trainer.config import load_config


    def saver(run_dir, start=1, count=None, signal_ready=False):
        cfg = load_config("cpu_grpo_tiny_put_on_plate")
        policy = build_policy(cfg, device="cpu")
        opt = torch.optim.Adam(policy.model.parameters(), lr=1e-4)
        policy.model.train()
        sum(p.float().sum() for p in policy.model.parameters()).backward()
        opt.step()
        it = start
        while count is None or it < start + count:
            save_train_checkpoint(Path(run_dir), cfg, policy, opt,
                                  {"iteration": it, "env_steps": 0, "asset_pack": "none", "wall_time_s": 0.0})
            if signal_ready:
                print(it, flush=True)
            it += 1
        return policy, opt


    if __name__ == "__main__":
        saver(sys.argv[1], start=int(sys.argv[2]), signal_ready=True)
""")


@pytest.fixture(scope="module")
def saver(tmp_path_factory):
    path = tmp_path_factory.mktemp("saver") / "saver.py"
    path.write_text(SAVER)
    namespace: dict = {}
    exec(compile(SAVER, str(path), "exec"), namespace)
    return path, namespace["saver"]


def _whole(checkpoint: Path) -> int:
    """Loads a checkpoint as a resume does; returns its iteration."""
    from vla_trainer.models import load_pretrained

    load_pretrained(checkpoint / "model")
    state = torch.load(checkpoint / "trainer_state.pt", weights_only=False)
    assert state["optimizer"]["state"], "optimizer state missing"
    return state["iteration"]


def test_checkpoints_are_kept_by_iteration_number_past_a_million(saver, tmp_path):
    """``iter_1000000`` sorts before ``iter_999999`` as text: pruning by name deleted the checkpoint
    just written and left ``latest`` naming nothing."""
    _, save = saver
    save(tmp_path, start=999_998, count=3)
    folders = sorted(p.name for p in (tmp_path / "checkpoints").glob("iter_*"))
    assert folders == ["iter_1000000", "iter_999999"]
    assert latest_checkpoint(tmp_path).name == "iter_1000000" and _whole(latest_checkpoint(tmp_path)) == 1_000_000


@pytest.mark.reliability(fault='disk full while saving a checkpoint (ENOSPC injected mid-write)', cases=1,
                         outcome='refused with a clear error; nothing on disk changed')
def test_disk_full_mid_save_raises_a_clear_error_and_keeps_the_last_checkpoint(saver, tmp_path, monkeypatch):
    _, save = saver
    run = tmp_path / "run"
    policy, opt = save(run, start=1, count=1)
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    real_save = torch.save

    def full_disk(obj, f, *args, **kwargs):  # the optimizer state is half written when the disk fills
        with open(f, "wb") as fh:
            fh.write(b"\0" * 4096)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))

    monkeypatch.setattr(torch, "save", full_disk)
    cfg = load_config("cpu_grpo_tiny_put_on_plate")
    with pytest.raises(CheckpointWriteError) as info:
        save_train_checkpoint(run, cfg, policy, opt, {"iteration": 2, "env_steps": 0, "asset_pack": "none",
                                                      "wall_time_s": 0.0})
    monkeypatch.setattr(torch, "save", real_save)
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC
    assert "iter_000002" in message and "No space left on device" in message
    assert "iter_000001" in message and "untouched" in message and "runner.resume_dir=auto" in message
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before  # nothing on disk changed, no half-written file left behind
    assert _whole(latest_checkpoint(run)) == 1


def _mount_tmpfs(where: Path, size_bytes: int) -> bool:
    where.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
                          capture_output=True)
    return done.returncode == 0


@pytest.mark.reliability(fault='disk full while saving a checkpoint (a real 1.5-checkpoint tmpfs)', cases=1,
                         outcome='refused with a clear error; the last checkpoint loads')
def test_a_real_full_file_system_keeps_the_last_checkpoint(saver, tmp_path):
    _, save = saver
    probe = tmp_path / "probe"
    policy, opt = save(probe, start=1, count=1)
    size = sum(p.stat().st_size for p in (probe / "checkpoints").rglob("*") if p.is_file())
    disk = tmp_path / "disk"
    if os.geteuid() != 0 or not _mount_tmpfs(disk, int(size * 1.5)):
        pytest.skip("no permission to mount a small tmpfs here (the injected disk-full test above covers the code)")
    try:
        cfg = load_config("cpu_grpo_tiny_put_on_plate")
        state = {"env_steps": 0, "asset_pack": "none", "wall_time_s": 0.0}
        save_train_checkpoint(disk, cfg, policy, opt, {"iteration": 1, **state})
        with pytest.raises(CheckpointWriteError, match="No space left on device"):
            save_train_checkpoint(disk, cfg, policy, opt, {"iteration": 2, **state})
        assert _whole(latest_checkpoint(disk)) == 1
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["iter_000001", "latest"]
    finally:
        subprocess.run(["umount", "--lazy", str(disk)], check=False)


@pytest.mark.reliability(fault='trainer killed (SIGKILL) at random points while saving', cases=6,
                         outcome='lost nothing: `latest` always names a whole checkpoint; leftovers tidied')
@pytest.mark.slow
def test_killed_mid_save_the_last_whole_checkpoint_is_always_found(saver, tmp_path):
    script, _ = saver
    run = tmp_path / "run"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    rng = np.random.default_rng(0)
    start, found = 1, []
    for _ in range(6):
        proc = subprocess.Popen([sys.executable, str(script), str(run), str(start)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            first = int(proc.stdout.readline())  # one save done; the next is under way
            time.sleep(float(rng.uniform(0.0, 0.8)))  # a save here takes about half a second
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait(30)
        latest = latest_checkpoint(run)
        assert latest is not None
        it = _whole(latest)
        assert it >= first
        found.append(it)
        start = it + 1
    assert found == sorted(set(found))  # every restart moved on from the last whole checkpoint
    # a clean save tidies whatever the kills left half-written
    proc = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(script.parent)!r}); "
                           f"from saver import saver; saver({str(run)!r}, start={start}, count=1)"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = sorted(p.name for p in (run / "checkpoints").iterdir())
    assert names == [f"iter_{start - 1:06d}", f"iter_{start:06d}", "latest"], names


def test_a_gpu_runs_optimizer_state_resumes_in_a_driver_without_a_gpu(saver, tmp_path, monkeypatch):
    """A GPU actor's Adam moments are saved tagged cuda:0; the resume reads them in the driver."""
    import torch.serialization

    from vla_trainer.checkpoint import read_train_state

    real_tag = torch.serialization.location_tag
    with monkeypatch.context() as m:  # what torch.save writes for tensors that live on a GPU
        m.setattr(torch.serialization, "location_tag",
                  lambda storage: "cuda:0" if storage.nbytes() > 64 else real_tag(storage))
        saver[1](tmp_path / "run", start=1, count=1)
    assert not torch.cuda.is_available()
    state = read_train_state(latest_checkpoint(tmp_path / "run"), load_config("cpu_grpo_tiny_put_on_plate"))
    moments = [v for s in state["optimizer"]["state"].values() for v in s.values() if v.numel() > 16]
    assert moments and all(v.device.type == "cpu" for v in moments)


@pytest.mark.reliability(fault='an interrupt while a checkpoint of the same name is replaced', cases=1,
                         outcome='the previous checkpoint is back under its name; latest finds it')
def test_an_interrupt_while_replacing_a_checkpoint_puts_the_previous_one_back(saver, tmp_path, monkeypatch):
    run = tmp_path / "run"
    saver[1](run, start=1, count=2)
    real_rename = Path.rename

    def interrupted(self, target):  # Ctrl-C just before the new iter_000002 is renamed in
        if ".tmp-" in self.name and Path(target).name == "iter_000002":
            raise KeyboardInterrupt
        return real_rename(self, target)

    with monkeypatch.context() as m:
        m.setattr(Path, "rename", interrupted)
        with pytest.raises(KeyboardInterrupt):
            saver[1](run, start=2, count=1)  # a resume from iteration 1 saves iteration 2 again
    assert latest_checkpoint(run) == run / "checkpoints" / "iter_000002" and _whole(latest_checkpoint(run)) == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["iter_000001", "iter_000002", "latest"]


def test_a_checkpoint_is_on_the_disk_before_latest_names_it(saver, tmp_path, monkeypatch):
    """fsync of every file and of the folders before the renames that publish them: after a power
    loss, latest never names files the disk did not receive."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: (events.append("fsync " + os.readlink(f"/proc/self/fd/{fd}")),
                                                 real_fsync(fd))[1])
    monkeypatch.setattr(os, "replace", lambda a, b: (events.append(f"replace {b}"), real_replace(a, b))[1])
    saver[1](tmp_path / "run", start=1, count=1)
    ckpt = tmp_path / "run" / "checkpoints"
    published = events.index(f"replace {ckpt / 'latest'}")
    synced = {e.split(" ", 1)[1] for e in events[:published] if e.startswith("fsync ")}
    tmp_dirs = {Path(p).parents[1].name for p in synced if Path(p).name == "model.safetensors"}
    assert len(tmp_dirs) == 1 and tmp_dirs.pop().startswith(".iter_000001.tmp-")  # the data, before its rename
    assert any(p.endswith("trainer_state.pt") for p in synced) and str(ckpt) in synced  # the folder's renames
    assert f"fsync {ckpt}" in events[published:]  # and the pointer's replace


# --------------------------------------------------------------------- corrupt checkpoints
def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _scribble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[:64] = np.random.default_rng(0).integers(0, 256, 64, dtype=np.uint8).tobytes()
    path.write_bytes(bytes(data))


CORRUPTIONS = {  # what a preempted copy, a full quota or a stray write leaves behind
    "weights cut short": ("model/model.safetensors", _cut),
    "weights header overwritten": ("model/model.safetensors", _scribble),
    "weights empty": ("model/model.safetensors", lambda p: p.write_bytes(b"")),
    "model config cut short": ("model/config.json", _cut),
    "model config a JSON list": ("model/config.json", lambda p: p.write_text("[]")),
    "trainer state cut short": ("trainer_state.pt", _cut),
    "trainer state overwritten": ("trainer_state.pt", _scribble),
    "meta cut short": ("meta.json", _cut),
}


@pytest.fixture(scope="module")
def two_checkpoints(saver, tmp_path_factory):
    run = tmp_path_factory.mktemp("two") / "run"
    saver[1](run, start=1, count=2)
    return run


@pytest.mark.reliability(fault='a corrupt or truncated checkpoint file (weights, configs, trainer state)',
                         cases=1,
                         outcome='refused: an error naming the file (and the run\'s other checkpoint); '
                                 'nothing on disk changed')
@pytest.mark.parametrize("damage", list(CORRUPTIONS))
def test_a_corrupt_checkpoint_is_refused_naming_the_file(damage, two_checkpoints, tmp_path):
    import shutil

    from vla_trainer.build import load_model
    from vla_trainer.checkpoint import read_train_state
    from vla_trainer.models import CorruptCheckpointError

    run = tmp_path / "run"
    shutil.copytree(two_checkpoints, run)
    latest = latest_checkpoint(run)
    assert latest.name == "iter_000002"
    name, corrupt = CORRUPTIONS[damage]
    corrupt(latest / name)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    cfg = load_config("cpu_grpo_tiny_put_on_plate")
    with pytest.raises(CorruptCheckpointError, match=Path(name).name) as info:
        if name.startswith("model/"):
            load_model(run)  # what vla-eval, vla-serve and franka-eval load; a resume loads the same
        else:
            read_train_state(latest, cfg)
    if not name.startswith("model/"):
        assert "runner.resume_dir=" in str(info.value) and "iter_000001" in str(info.value)
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before
    # the run's other checkpoint is whole and resumes
    assert read_train_state(run / "checkpoints" / "iter_000001", cfg)["iteration"] == 1


def test_a_checkpoint_from_before_a_setting_existed_resumes_while_it_holds_its_default(tmp_path):
    """A setting added to the trainer after a checkpoint was written is absent from its config: at its
    default (how the run trained) the resume goes on; set to anything else it is a config change."""
    from vla_trainer.checkpoint import check_resumable, fingerprint
    from vla_trainer.config import to_dict

    now = fingerprint(to_dict(load_config("cpu_grpo_tiny_put_on_plate")))
    older = {k: v for k, v in now.items() if k != "algorithm.bc_coef"}  # as if bc_coef came later
    check_resumable(older, now, tmp_path)
    changed = fingerprint(to_dict(load_config("cpu_grpo_tiny_put_on_plate", ["algorithm.bc_coef=0.5",
                                                                             "algorithm.bc_demo_dirs=[d]"])))
    with pytest.raises(ValueError, match=r"algorithm.bc_coef: checkpoint '<absent>' vs now 0.5"):
        check_resumable(older, changed, tmp_path)
    with pytest.raises(ValueError, match=r"algorithm.group_size"):  # a key both hold, changed: refused as ever
        check_resumable(now, {**now, "algorithm.group_size": now["algorithm.group_size"] + 1}, tmp_path)
    # a run a worker's death stopped resumes with more restarts allowed (a restart changes no data)
    more = fingerprint(to_dict(load_config("cpu_grpo_tiny_put_on_plate", ["cluster.max_restarts=5"])))
    check_resumable(now, more, tmp_path)


@pytest.mark.reliability(fault="a second trainer started on a run folder that one is training in", cases=1,
                         outcome="refused at once naming the first's pid; a killed holder frees the folder")
def test_a_second_trainer_on_one_run_folder_is_refused_naming_the_first(tmp_path):
    from vla_trainer.checkpoint import run_folder_lock
    from vla_trainer.runner import train

    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from vla_trainer.checkpoint import run_folder_lock
        with run_folder_lock({str(tmp_path)!r}):
            print("held", flush=True)
            time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).resolve().parents[2])
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"{tmp_path} is in use: another process \(pid {holder.pid}\)"):
            train(load_config("cpu_grpo_tiny_put_on_plate"), run_dir=tmp_path)
        assert not (tmp_path / "config.yaml").exists()  # nothing of the second run was written
    finally:
        holder.kill()
        holder.wait()
    with run_folder_lock(tmp_path):  # the kernel released a killed holder's lock
        pass
