"""Atomic checkpoint folders and the trainer's resumable state.

A checkpoint folder ``iter_000010/`` holds

    model/              the policy, loadable on its own (``load_model``; LoRA adapters if is_lora)
    trainer_state.pt    optimizer state, RNG states, iteration, metric history
    config.yaml         the full recipe in force
    meta.json           iteration, env steps, asset pack, config fingerprint, wall time

It is written into a hidden temporary sibling and renamed into place, and ``latest`` (a one-line
file naming the newest folder) is replaced atomically afterwards: a crash at any moment leaves
the previous good checkpoint and pointer untouched.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def write_atomic_dir(out_dir: str | Path, fill: Callable[[Path], None]) -> Path:
    """Calls ``fill(tmp)`` on a fresh temporary folder, then renames it to ``out_dir``.

    ``out_dir`` is either its previous content or the complete new one, never half-written.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{time.time_ns()}"
    tmp.mkdir()
    try:
        fill(tmp)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{time.time_ns()}"
            out_dir.rename(old)
        tmp.rename(out_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


TRAINING_RECORDS = ("sft_metrics.json", "vision_metrics.json", "sft_curve.png")


def publish_half_precision(src: str | Path, dst: str | Path, made_by: dict) -> Path:
    """Copies the model checkpoint folder ``src`` to ``dst`` (atomically) with its floating-point
    weights stored as float16 and ``made_by`` (how it was produced) in ``made_by.json``.
    Training records (``TRAINING_RECORDS``, which name the folder they were written to) stay
    behind; put what matters of them into ``made_by``.

    Half the bytes of a float32 checkpoint, for one that is shipped in the repository. The config
    still says float32, so ``load_pretrained(dst)`` returns a float32 model (the weights rounded to
    float16, relative error <= 2^-11).
    """
    from safetensors.torch import load_file, save_file

    src = Path(src)
    if not (src / "config.json").is_file() or not (src / "model.safetensors").is_file():
        raise FileNotFoundError(f"{src} is not a model checkpoint folder (config.json + model.safetensors)")

    def fill(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name != "model.safetensors" and f.name not in TRAINING_RECORDS:
                shutil.copy2(f, tmp / f.name)
        weights = load_file(str(src / "model.safetensors"))
        half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
        save_file(half, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "made_by.json").write_text(json.dumps(made_by, indent=1) + "\n")

    return write_atomic_dir(dst, fill)


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{time.time_ns()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def save_model(policy, directory: Path) -> None:
    """The policy's weights (adapters for a peft model) and tokenizer into ``directory``."""
    from transformers.utils import logging as hf_logging

    from .models import save_lora

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint would bury the training bar
    if hasattr(policy.model, "get_base_model"):
        save_lora(policy.model, directory)
    else:
        policy.model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)


# Keys that may change between a run and its resumption: how long / how often, where to log.
RESUMABLE_CHANGES = ("runner.max_epochs", "runner.max_wall_minutes", "runner.val_check_interval",
                     "runner.save_interval", "runner.resume_dir", "runner.progress_bar", "runner.logger")


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


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


def resolve_model_dir(path: str | Path) -> Path:
    """The model folder that ``path`` names: a model folder itself (``vla-train sft --out``, a
    shipped warm start, the adapters of a LoRA run's checkpoint), a training checkpoint (its
    ``model/``) or a run folder (its latest checkpoint's ``model/``).

    Raises:
        FileNotFoundError: none of these.
    """
    path = Path(path)
    latest = latest_checkpoint(path)
    for candidate in (path, path / "model", *([latest / "model"] if latest is not None else [])):
        if (candidate / "config.json").is_file() or (candidate / "adapter_config.json").is_file():
            return candidate
    raise FileNotFoundError(f"{path}: not a checkpoint folder: neither a model folder (config.json), a training "
                            "checkpoint (model/) nor a run folder (checkpoints/latest)")


def load_model(path: str | Path):
    """``(model, tokenizer, model_dir)`` of what ``path`` names (``resolve_model_dir``), on the CPU.

    A LoRA run's checkpoint holds adapters only: they are applied to the base model that the
    checkpoint's ``config.yaml`` names (``actor.model.model_path``, or the preset and seed) and
    merged into its weights.

    Raises:
        FileNotFoundError: no model there, or adapters whose base model is not found.
        AdapterMismatchError: the base model found is not the one the adapters were trained on.
    """
    from .models import load_pretrained

    model_dir = resolve_model_dir(path)
    if (model_dir / "config.json").is_file():
        return (*load_pretrained(model_dir), model_dir)
    from .build import build_policy
    from .config import load_config
    from .models import merge_lora

    recipe = model_dir.parent / "config.yaml"
    if not recipe.is_file():
        raise FileNotFoundError(f"{model_dir} holds LoRA adapters without the training checkpoint's config.yaml "
                                "beside them, which names their base model; load them with "
                                "vla_trainer.models.load_lora onto that model")
    cfg = load_config(recipe)
    base = cfg.actor.model.model_path
    if base is not None and not (Path(base) / "config.json").is_file():
        raise FileNotFoundError(f"{model_dir} holds LoRA adapters for the base model actor.model.model_path={base} "
                                f"({recipe}), which is not a model folder from here; run from the folder the "
                                "training ran in")
    policy = build_policy(cfg, resume_model_dir=model_dir, device="cpu")
    return merge_lora(policy.model, inplace=True).eval(), policy.tokenizer, model_dir


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


def check_resumable(saved_flat: dict, current_flat: dict, where: Path) -> None:
    """Raises ValueError listing the keys whose values differ from the checkpoint's config."""
    keys = sorted(set(saved_flat) | set(current_flat))
    diff = [f"{k}: checkpoint {saved_flat.get(k, '<absent>')!r} vs now {current_flat.get(k, '<absent>')!r}"
            for k in keys if saved_flat.get(k) != current_flat.get(k)]
    if diff:
        raise ValueError(f"cannot resume from {where}: it was written by another config; differing keys:\n  "
                         + "\n  ".join(diff) + "\n(only " + ", ".join(RESUMABLE_CHANGES) + " may change)")
