"""The policy a supervised stage starts from: a checkpoint to continue, or a new model of a preset,
with what the stage adds to it (a place code, a layout token, the robot-state input)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from vla_trainer.data import DemoFolders


def check_demo_folders(paths: Sequence[Path]) -> None:
    """Raises ``ValueError`` saying why one of ``paths`` is not a readable demo folder."""
    for path in paths:
        if not path.exists():
            raise ValueError(f"demo folder {path} does not exist")
        if not path.is_dir():
            raise ValueError(f"demo folder {path} is not a directory")
        if not (path / "index.json").is_file():
            raise ValueError(f"demo folder {path} has no index.json (record demos with: vla-envs collect-demos)")


def load_init_checkpoint(directory: Path, flag: str = "--init-from"):
    """``(model, tokenizer)`` of the model that ``directory`` names: a model folder, a training
    checkpoint or a run folder (its latest checkpoint), LoRA runs' included; ``flag``: the option
    that named it.

    Raises:
        FileNotFoundError: ``directory`` holds no model; the message names ``flag``.
    """
    from vla_trainer.build import load_model

    try:
        model, tokenizer, _ = load_model(directory)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"{flag} {e}") from None
    return model, tokenizer


def checkpoint_policy(directory: Path, flag: str = "--checkpoint", unnorm_key: str | None = None):
    """A ``VLAPolicy`` of the model that ``directory`` names (``load_init_checkpoint``), un-normalising
    actions with ``unnorm_key``, else the statistics its training run acted with (a training
    checkpoint's recipe), else the model's only set.

    Raises:
        FileNotFoundError: no model there (the message names ``flag``).
        UnknownUnnormKeyError: that key is not among the model's statistics (it lists them), or none
            was given or recorded and the model holds several.
    """
    from vla_trainer.checkpoint import recorded_unnorm_key, resolve_model_dir
    from vla_trainer.models import VLAPolicy

    model, tokenizer = load_init_checkpoint(directory, flag=flag)
    if unnorm_key is None:
        unnorm_key = recorded_unnorm_key(resolve_model_dir(directory))
    return VLAPolicy(model, tokenizer, unnorm_key=unnorm_key)


def starting_policy(demos: DemoFolders, *, preset: str = "tiny-openvla-oft", init_from: Path | None = None,
                    seed: int = 0, slot_embeddings: str | None = None, patch_positions: str | None = None,
                    layout_token: str | None = None, proprio: bool = False, unnorm_key: str | None = None):
    """A ``VLAPolicy``: ``init_from``'s model, or a new ``preset`` model; what is new starts from ``seed``.

    ``patch_positions="sincos"`` / ``layout_token="linear"`` give a model without one a new one to
    learn (None: as it is); ``proprio`` makes it read the robot state, z-scored by the demos'
    statistics. Raises ``ValueError`` naming the setting that cannot apply (and
    ``FileNotFoundError`` for a missing checkpoint or demo file).
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # presets are built locally; nothing to download
    from vla_trainer.models import PRESETS, VLAModelError, VLAPolicy, build_model

    demo_paths = [Path(demos)] if isinstance(demos, (str, Path)) else [Path(d) for d in demos]
    check_demo_folders(demo_paths)
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; available: {sorted(PRESETS)}")
    shape = {k: v for k, v in (("slot_embeddings", slot_embeddings), ("patch_positions", patch_positions),
                               ("layout_token", layout_token)) if v}
    if "slot_embeddings" in shape and not preset.endswith("-oft"):
        raise ValueError(f"--slot-embeddings applies to OpenVLA-OFT presets; {preset!r} decodes token by token")
    if init_from is not None and "slot_embeddings" in shape:
        raise ValueError("--slot-embeddings shapes a new model; with --init-from the checkpoint's slot inputs "
                         "are used as is")
    import torch

    # what a stage adds to a checkpoint (place code, layout token, state input) starts from ``seed``, not
    # from whatever an earlier stage left in the generator: a resumed warm start equals an uninterrupted one
    torch.manual_seed(seed)
    try:
        if init_from is not None:
            model, tokenizer = load_init_checkpoint(Path(init_from))
            if unnorm_key is None:  # continue with the statistics the checkpoint was trained with
                from vla_trainer.checkpoint import recorded_unnorm_key, resolve_model_dir

                unnorm_key = recorded_unnorm_key(resolve_model_dir(Path(init_from)))
            if patch_positions is not None and patch_positions != model.config.patch_positions:
                if patch_positions == "none":
                    raise ValueError(f"--patch-positions none: {init_from} has a trained place code (sincos), "
                                     "which a continuation keeps; leave the flag out")
                model.add_patch_positions()  # a checkpoint without a code gets a new one to learn
            if layout_token is not None and layout_token != model.config.layout_token:
                if layout_token == "none":
                    raise ValueError(f"--layout-token none: {init_from} has a trained layout token (linear), "
                                     "which a continuation keeps; leave the flag out")
                model.add_layout_token()
        else:
            model, tokenizer = build_model(preset, seed=seed, **shape)
        if proprio and not model.config.proprio_dim:
            from vla_trainer.data import state_stats

            model.add_proprio(state_stats(demo_paths))  # the demos' robot state, z-scored by their statistics
    except VLAModelError as e:
        raise ValueError(str(e)) from None
    if tokenizer is None:
        raise ValueError(f"preset {preset!r} has no built-in tokenizer; only the tiny presets can be trained "
                         "from scratch here")
    return VLAPolicy(model, tokenizer, unnorm_key=unnorm_key)
