"""Model folders: save a policy, find the model folder a path names, load it, publish a copy.

A model folder holds ``config.json`` + ``model.safetensors`` + the tokenizer (or a LoRA run's
adapters, ``adapter_config.json``), loadable on its own with ``vla_trainer.build.load_model``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from .atomic import write_atomic_dir
from .layout import latest_checkpoint

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
    check_model_out_dir(dst)

    def fill(tmp: Path) -> None:
        for f in src.iterdir():
            if f.is_file() and f.name != "model.safetensors" and f.name not in TRAINING_RECORDS:
                shutil.copy2(f, tmp / f.name)
        weights = load_file(str(src / "model.safetensors"))
        half = {k: v.half() if v.is_floating_point() else v for k, v in weights.items()}
        save_file(half, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "made_by.json").write_text(json.dumps(made_by, indent=1) + "\n")

    return write_atomic_dir(dst, fill)


def save_model(policy, directory: Path) -> None:
    """The policy's weights (adapters for a peft model) and tokenizer into ``directory``."""
    from transformers.utils import logging as hf_logging

    from ..models import save_lora

    hf_logging.disable_progress_bar()  # one "Writing model shards" bar per checkpoint would bury the training bar
    if hasattr(policy.model, "get_base_model"):
        save_lora(policy.model, directory)
    else:
        policy.model.save_pretrained(directory)
    policy.tokenizer.save_pretrained(directory)


def export_merged(model, tokenizer, directory: str | Path, inplace: bool = False) -> Path:
    """Writes a plain Hugging Face checkpoint: merged weights, config, code and tokenizer.

    The config carries the normalisation statistics (``norm_stats``) and the action tokenizer
    settings (``tokenizer_vocab_size``, ``n_action_bins``, prompt), and the model code is saved
    beside the weights, so that it loads offline with::

        AutoModelForImageTextToText.from_pretrained(directory, trust_remote_code=True)

    The folder is written whole (``write_atomic_dir``): an export killed half-way leaves the previous
    one as it was.

    Args:
        inplace: merge into ``model`` itself (saves memory for 7B models; the LoRA wrapper is
            then consumed). By default a copy is merged and ``model`` keeps training.

    Raises:
        FileExistsError: ``directory`` holds something other than a model (``check_model_out_dir``).
    """
    from ..models import merge_lora

    directory = check_model_out_dir(directory)
    merged = merge_lora(model, inplace=inplace)

    def fill(tmp: Path) -> None:
        merged.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)

    return write_atomic_dir(directory, fill)


def is_model_dir(path: str | Path) -> bool:
    path = Path(path)
    return (path / "config.json").is_file() or (path / "adapter_config.json").is_file()


def check_model_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` if a model folder written there loses nothing: it does not exist yet, is an empty
    folder, or is a model folder (replaced whole, as running the same command again expects).
    Call it before the work whose result goes there, not only when saving.

    Raises:
        FileExistsError: ``out_dir`` is a file, or a folder holding something else (demos, a run,
            notes), which writing the model there would delete.
    """
    out_dir = Path(out_dir)
    if not out_dir.exists() or is_model_dir(out_dir):
        return out_dir
    if not out_dir.is_dir():
        raise FileExistsError(f"{out_dir} is a file; a model is written as a folder: give a new folder")
    held = sorted(p.name for p in out_dir.iterdir())
    if held:
        shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3 else "")
        raise FileExistsError(f"{out_dir} is not a model folder and holds {shown}; writing the model there would "
                              "replace them: give a new folder (or an earlier model folder to replace)")
    return out_dir


def resolve_model_dir(path: str | Path) -> Path:
    """The model folder that ``path`` names: a model folder itself (``vla-train sft --out``, a
    shipped warm start, the adapters of a LoRA run's checkpoint), a training checkpoint (its
    ``model/``) or a run folder (its latest checkpoint's ``model/``), also through a run's
    ``checkpoints/latest`` pointer file.

    Raises:
        FileNotFoundError: none of these.
    """
    path = Path(path)
    if path.name == "latest" and path.is_file():  # <run>/checkpoints/latest: the checkpoint it names
        path = path.parent.parent
    latest = latest_checkpoint(path)
    for candidate in (path, path / "model", *([latest / "model"] if latest is not None else [])):
        if is_model_dir(candidate):
            return candidate
    raise FileNotFoundError(f"{path}: not a checkpoint folder: neither a model folder (config.json), a training "
                            "checkpoint (model/) nor a run folder (checkpoints/latest)")


def checkpoint_recipe(model_dir: str | Path):
    """The ``TrainConfig`` a training checkpoint's run was made with (its ``config.yaml`` beside
    ``model/``), or None for a model folder that has none (an export, a warm start, an SFT output).

    Raises:
        ConfigError: the file is there but is no recipe of this version (the message names it).
    """
    model_dir = Path(model_dir)
    recipe = model_dir.parent / "config.yaml"
    if model_dir.name != "model" or not recipe.is_file():
        return None
    from ..config.loading import load_recipe
    from ..config.schema import TrainConfig

    return load_recipe(TrainConfig, recipe)


def recorded_unnorm_key(model_dir: str | Path) -> str | None:
    """Which of the model's action statistics its actions mean, as its training recorded it.

    A training checkpoint: the key its policy acted with (its ``meta.json``), else its run's
    ``actor.model.unnorm_key``, else (a run that left it to its ``model_path``, written before
    ``meta.json`` recorded it) the key recorded for that model. A ``vla-train sft`` output: the key
    it was fine-tuned with (its ``sft_metrics.json``). None when nothing is recorded (a model with
    one statistics set needs none)."""
    model_dir = Path(model_dir)
    cfg = checkpoint_recipe(model_dir)
    if cfg is None:
        return _recorded_key(model_dir / "sft_metrics.json")
    key = _recorded_key(model_dir.parent / "meta.json")
    if key is None:
        key = cfg.actor.model.unnorm_key
    if key is None and cfg.actor.model.model_path is not None:
        try:
            key = recorded_unnorm_key(resolve_model_dir(cfg.actor.model.model_path))
        except FileNotFoundError:  # moved since: nothing more is known
            return None
    return key


def _recorded_key(record: Path) -> str | None:
    try:
        key = json.loads(record.read_text()).get("unnorm_key") if record.is_file() else None
    except (OSError, ValueError, AttributeError):  # an unreadable record says nothing
        return None
    return key if isinstance(key, str) else None
