"""Training checkpoints: what a resumed run needs to continue exactly as the uninterrupted one.

A checkpoint folder ``checkpoints/iter_000010/`` holds

    model/              the policy, loadable on its own (``vla_trainer.build.load_model``; LoRA adapters if is_lora)
    trainer_state.pt    optimizer state, RNG states, iteration, env steps
    config.yaml         the full recipe in force
    meta.json           iteration, env steps, asset pack, action statistics key, config fingerprint, wall time

It is written atomically (``atomic.write_atomic_dir``), and ``latest`` (a one-line file naming
the newest folder) is replaced atomically afterwards: a crash at any moment leaves the previous
good checkpoint and pointer untouched, and the next save clears what the crash left half-written.
A write that fails (disk full) raises ``CheckpointWriteError`` naming the checkpoint that is still
whole.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import shutil
import time
from pathlib import Path

from ..config import to_dict, to_yaml
from ..config.schema import TrainConfig
from .atomic import remove_leftovers, write_atomic_dir, write_text_atomic
from .layout import KEEP_CHECKPOINTS, checkpoint_folders, checkpoint_name, latest_checkpoint
from .model_io import save_model

# Keys that may change between a run and its resumption: how long / how often, where to log.
RESUMABLE_CHANGES = ("runner.max_epochs", "runner.max_wall_minutes", "runner.val_check_interval",
                     "runner.save_interval", "runner.resume_dir", "runner.progress_bar", "runner.logger",
                     "cluster.max_restarts")
"""Keys a resumed run may change: none changes what is trained (a restarted worker reruns the rollout it
interrupted to the same data), so a run a worker's death stopped resumes with more restarts allowed."""


def fingerprint(cfg_dict: dict) -> dict:
    """The config without the keys a resumption may change, flattened to ``{dotted.key: value}``."""
    flat: dict = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict) and not prefix.endswith("env_kwargs"):
            for k, v in node.items():
                walk(f"{prefix}.{k}" if prefix else k, v)
        elif not any(prefix == k or prefix.startswith(k + ".") for k in RESUMABLE_CHANGES):
            flat[prefix] = node

    walk("", cfg_dict)
    return flat


def fingerprint_hash(flat: dict) -> str:
    return hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode()).hexdigest()[:16]


def resolve_resume(resume_dir: str, run_dir: Path) -> Path:
    """The checkpoint folder ``runner.resume_dir`` names ("auto": the run's latest)."""
    if resume_dir == "auto":
        found = latest_checkpoint(run_dir)
        if found is None:
            raise FileNotFoundError(f"runner.resume_dir=auto: no checkpoint under {run_dir}/checkpoints")
        return found
    path = Path(resume_dir)
    if path.is_dir() and not (path / "trainer_state.pt").is_file():
        found = latest_checkpoint(path)  # a run folder: take its latest
        if found is not None:
            return found
    if not (path / "trainer_state.pt").is_file():
        raise FileNotFoundError(f"runner.resume_dir={resume_dir}: not a checkpoint folder (no trainer_state.pt) "
                                "and not a run folder with checkpoints/latest")
    return path


def set_aside_newer_checkpoints(run_dir: Path, resume_from: Path) -> Path | None:
    """Before a run continues from one of its own checkpoints that is not its latest: the newer
    checkpoints (a future the continuation abandons) and the run's ``metrics.jsonl`` as it was go to
    ``checkpoints/abandoned_after_<resumed>_<time>/``, and ``latest`` names ``resume_from``. Left in
    place, the first saves would delete them as old while the newest survived them: ``latest``
    and ``runner.resume_dir=auto`` would go back to the abandoned run after a crash.

    ``latest`` is moved first: a crash part way leaves it naming ``resume_from`` and the run
    resumable again the same way. Returns the folder they went to, or None when none is newer."""
    ckpt_root = Path(run_dir) / "checkpoints"
    if resume_from.resolve().parent != ckpt_root.resolve():
        return None
    folders = checkpoint_folders(ckpt_root)
    names = [p.name for p in folders]
    if resume_from.name not in names:
        return None
    newer = folders[names.index(resume_from.name) + 1:]
    if not newer:
        return None
    write_text_atomic(ckpt_root / "latest", resume_from.name + "\n")
    aside = ckpt_root / f"abandoned_after_{resume_from.name}_{time.strftime('%Y%m%d-%H%M%S')}"
    aside.mkdir()
    if (Path(run_dir) / "metrics.jsonl").is_file():
        shutil.copy2(Path(run_dir) / "metrics.jsonl", aside / "metrics.jsonl")
    for folder in newer:
        folder.rename(aside / folder.name)
    return aside


def read_train_state(checkpoint: Path, cfg: TrainConfig) -> dict:
    """The training state saved in ``checkpoint`` (optimizer, RNG states, counters), after
    checking that its config is ``cfg`` up to ``RESUMABLE_CHANGES``.

    Raises:
        CorruptCheckpointError: meta.json or trainer_state.pt cannot be read; names the file and
            the run's other checkpoints to resume from instead.
        ValueError: the checkpoint was written by another config (``check_resumable``).
    """
    import torch

    from ..models.checkpoint import read_json_object
    from ..models.errors import CorruptCheckpointError

    others = [p.name for p in checkpoint_folders(checkpoint.parent) if p != checkpoint]
    instead = (f"; resume from another of the run's checkpoints (runner.resume_dir={checkpoint.parent / others[-1]})"
               if others else "")
    try:
        meta = read_json_object(checkpoint / "meta.json")
    except CorruptCheckpointError as e:
        raise CorruptCheckpointError(f"{e}{instead}") from None
    if not isinstance(meta.get("fingerprint_keys"), dict):
        raise CorruptCheckpointError(f"{checkpoint / 'meta.json'} has no 'fingerprint_keys' object (the config it "
                                     f"was written with){instead}")
    check_resumable(meta["fingerprint_keys"], fingerprint(to_dict(cfg)), checkpoint)
    path = checkpoint / "trainer_state.pt"
    try:
        # weights_only: tensors and plain values only, so a checkpoint from elsewhere cannot run code.
        # map_location: a GPU actor's optimizer moments are tagged cuda:N, and this runs in the driver
        # (maybe without a GPU); load_state_dict moves them onto each parameter's device
        state = torch.load(path, weights_only=True, map_location="cpu")
    except Exception as e:  # noqa: BLE001  (torch raises RuntimeError, EOFError, UnpicklingError, ...)
        raise CorruptCheckpointError(f"{path} cannot be read ({type(e).__name__}: {str(e).splitlines()[0]}); the "
                                     f"file is damaged or was cut short{instead}") from None
    missing = [k for k in ("iteration", "env_steps", "wall_time_s", "optimizer") if k not in state]
    if missing:
        raise CorruptCheckpointError(f"{path} lacks {missing}: not a training state this trainer wrote{instead}")
    return state


def check_resumable(saved_flat: dict, current_flat: dict, where: Path) -> None:
    """Raises ValueError listing the keys whose values differ from the checkpoint's config. A key the
    checkpoint's config lacks (a setting added to the trainer since it was written) passes while it
    holds its default: the run trained without it, as the default behaves."""
    defaults = fingerprint(to_dict(TrainConfig()))
    missing = object()

    def differs(key: str) -> bool:
        if key not in saved_flat and key in current_flat:
            return current_flat[key] != defaults.get(key, missing)
        return saved_flat.get(key, missing) != current_flat.get(key, missing)

    keys = sorted(set(saved_flat) | set(current_flat))
    diff = [f"{k}: checkpoint {saved_flat.get(k, '<absent>')!r} vs now {current_flat.get(k, '<absent>')!r}"
            for k in keys if differs(k)]
    if diff:
        raise ValueError(f"cannot resume from {where}: it was written by another config; differing keys:\n  "
                         + "\n  ".join(diff) + "\n(only " + ", ".join(RESUMABLE_CHANGES) + " may change)")


FULL_BELOW_BYTES = 16 * 2**20
"""A failed write with less free space than this is reported as a full disk."""


class CheckpointWriteError(OSError):
    """A training checkpoint could not be written (disk full, quota, permissions); the previous
    one is untouched."""


def save_train_checkpoint(run_dir: Path, cfg: TrainConfig, policy, optimizer, state: dict) -> Path:
    """``run_dir/checkpoints/iter_XXXXXX`` (atomic) and the ``latest`` pointer; keeps the newest
    ``KEEP_CHECKPOINTS``. ``state`` holds at least iteration, env_steps, asset_pack, wall_time_s.

    Raises:
        CheckpointWriteError: the write failed; nothing already on disk was changed.
    """
    import torch  # here, not at the top: ``vla-eval --help`` imports this package and stays fast

    ckpt_root = Path(run_dir) / "checkpoints"
    name = checkpoint_name(state["iteration"])
    if ckpt_root.is_dir():
        remove_leftovers(ckpt_root)  # one writer per run: anything half-written is a killed save's

    free_at_failure: list[int] = []

    def fill(tmp: Path) -> None:
        try:
            save_model(policy, tmp / "model")
            torch.save({**state, "optimizer": optimizer.state_dict()}, tmp / "trainer_state.pt")
            (tmp / "config.yaml").write_text(to_yaml(cfg))
            flat = fingerprint(to_dict(cfg))
            meta = {k: state[k] for k in ("iteration", "env_steps", "asset_pack", "wall_time_s")}
            # the action statistics the policy acts with, resolved (recorded_unnorm_key): the
            # run's config may leave it to model_path, which can move or change
            meta["unnorm_key"] = getattr(policy, "unnorm_key", None)
            (tmp / "meta.json").write_text(json.dumps(
                {**meta, "config_fingerprint": fingerprint_hash(flat), "fingerprint_keys": flat}, indent=1,
                default=str))
        except Exception:
            # measured before the half-written folder is removed: torch.save reports a full disk
            # only as a RuntimeError of its C++ stream
            with contextlib.suppress(OSError):
                free_at_failure.append(shutil.disk_usage(tmp).free)
            raise

    try:
        path = write_atomic_dir(ckpt_root / name, fill)
        write_text_atomic(ckpt_root / "latest", name + "\n")
    except Exception as e:
        raise _write_error(e, ckpt_root / name, latest_checkpoint(run_dir), free_at_failure) from e
    for old in checkpoint_folders(ckpt_root)[:-KEEP_CHECKPOINTS]:
        if old != path:  # never the one just written
            shutil.rmtree(old, ignore_errors=True)
    return path


def _write_error(e: Exception, path: Path, previous: Path | None, free_at_failure: list[int]) -> CheckpointWriteError:
    free = free_at_failure[0] if free_at_failure else None
    full = (isinstance(e, OSError) and e.errno == errno.ENOSPC) or (free is not None and free < FULL_BELOW_BYTES)
    cause = e.strerror if isinstance(e, OSError) and e.strerror else f"{type(e).__name__}: {e}"
    reason = (f"No space left on device ({free / 2**20:.1f} MiB free)" if full and free is not None
              else "No space left on device" if full else cause)
    kept = f"the last whole checkpoint, {previous}, is untouched" if previous else "no earlier checkpoint exists"
    return CheckpointWriteError(errno.ENOSPC if full else getattr(e, "errno", None),
                                f"could not write the checkpoint {path}: {reason}; {kept}. Free space under "
                                f"{path.parent} (or point --run-dir elsewhere) and resume with runner.resume_dir=auto")


def rng_state(update_gen) -> dict:
    """The minibatch-order generator's and torch's global generator's (dropout) states."""
    import torch

    return {"update_gen": update_gen.get_state(), "torch_rng": torch.get_rng_state()}


def restore_rng(update_gen, state: dict | None) -> None:
    """Restores what ``rng_state`` saved (nothing when ``state`` is None: a fresh run)."""
    import torch

    if state is not None:
        update_gen.set_state(state["update_gen"])
        torch.set_rng_state(state["torch_rng"])
