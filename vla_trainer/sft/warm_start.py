"""A supervised warm start made from its recipe (``vla-train warm-start --config NAME --out DIR``),
and its publication: the last SFT stage in float16, with ``made_by.json`` saying how it was made
and one SFT curve over all its stages.

The run folder holds one folder per stage, each written whole (atomically) when the stage ends,
so a run that is started again skips what is done and goes on:

    warm_start_recipe.yaml  the resolved recipe (a run continues only with the same one)
    demos/                  scripted-expert demos (vla-envs collect-demos)
    vision/                 vision pretraining of a new model (recipe init: vision)
    sft_0/ sft_1/ ...       the SFT stages, each from the one before
    sft/                    a copy of the last stage

Everything in ``made_by.json`` is read from what the stages wrote: the demos' ``index.json``,
``vision_metrics.json``, each stage's ``sft_metrics.json`` (settings and metrics) and
``config.json`` (its inputs), and the recipe.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from vla_envs.demos import load_index
from vla_trainer.checkpoint import publish_half_precision, write_atomic_dir
from vla_trainer.config.warm_start import WarmStartConfig, load_warm_start, warm_start_yaml
from vla_trainer.data import scene_options
from vla_trainer.metrics_log import sft_curve
from vla_trainer.sft.start import starting_policy

PROJECT_ROOT = Path(__file__).resolve().parents[2]
RECIPE_FILE = "warm_start_recipe.yaml"
STAGE_METRICS = ("initial_loss", "final_loss", "final_token_accuracy", "final_action_l1", "action_l1_of_zero",
                 "steps", "scene_loss_weight", "first_frame_repeats", "release_frame_repeats", "final_scene_loss",
                 "curve")
VISION_METRICS = ("steps", "targets", "num_frames", "num_val_frames", "val_before", "val_after", "val_of_mean")


def project_path(path: str | Path) -> Path:
    """``path`` as given when it exists from here, else relative to the project (where the shipped
    recipes' ``warm_start/...`` folders are)."""
    path = Path(path)
    return path if path.is_absolute() or path.exists() else PROJECT_ROOT / path


def demo_env_kwargs(cfg: WarmStartConfig) -> dict:
    """The scene the demos are recorded in: ``env.train.env_kwargs`` of the recipe ``demos.env_from``."""
    from vla_trainer.config import load_config

    return dict(load_config(cfg.demos.env_from).env.train.env_kwargs)


def claim_run_dir(run_dir: Path, cfg: WarmStartConfig) -> None:
    """Writes the resolved recipe into ``run_dir``; a folder made with another recipe is refused
    (its stages would be mixed with this one's)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    text = warm_start_yaml(cfg)
    recorded = run_dir / RECIPE_FILE
    if recorded.is_file() and recorded.read_text() != text:
        raise ValueError(f"{run_dir} holds a warm start made with another recipe ({recorded}); give a new folder "
                         "or remove it")
    index = run_dir / "demos" / "index.json"
    if index.is_file() and isinstance(recorded_with := load_index(run_dir / "demos").get("env_kwargs"), dict):
        then, now = scene_options(recorded_with), scene_options(demo_env_kwargs(cfg))
        if then != now:  # demos.env_from is another recipe: its scene can change under the same text
            raise ValueError(f"{run_dir}'s demos were recorded with the scene options {then}; the recipe "
                             f"{cfg.demos.env_from} now gives {now}: give a new folder or remove it")
    recorded.write_text(text)


def record_demos(cfg: WarmStartConfig, out: Path) -> None:
    """The scripted expert's episodes into ``out`` (written as ``out.partial``, then renamed)."""
    d = cfg.demos
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    cmd = [sys.executable, "-m", "vla_envs.cli", "collect-demos", d.env_id, "--num-envs", str(d.num_envs),
           "--steps", "1000000", "--episodes", str(d.episodes), "--image-size", str(d.image_size),
           "--seed", str(d.seed), "--env-kwargs", json.dumps(demo_env_kwargs(cfg)),
           "--expert-kwargs", json.dumps(d.expert_kwargs), "--out", str(partial)]
    subprocess.run(cmd, check=True)
    partial.rename(out)


def make_warm_start(cfg: WarmStartConfig, run_dir: str | Path, *, progress: bool = True) -> Path:
    """Runs every stage of ``cfg`` not yet in ``run_dir``; returns ``run_dir/sft`` (the last stage)."""
    from vla_trainer.sft.train import train_sft
    from vla_trainer.sft.vision import pretrain_vision

    run_dir = Path(run_dir)
    claim_run_dir(run_dir, cfg)
    demos = run_dir / "demos"
    if not (demos / "index.json").is_file():
        print(f"== scripted-expert demos of {cfg.demos.env_id} -> {demos}", flush=True)
        record_demos(cfg, demos)
    if cfg.init == "vision":
        previous = run_dir / "vision"
        if not (previous / "config.json").is_file():
            print(f"== vision pretraining of a new {cfg.preset} -> {previous}", flush=True)
            v = cfg.vision
            policy = starting_policy(demos, preset=cfg.preset, seed=v.seed, slot_embeddings=v.slot_embeddings)
            pretrain_vision(policy, demos, steps=v.steps, batch_size=v.batch_size, lr=v.lr, seed=v.seed,
                            eval_every=v.eval_every, out_dir=previous, progress=progress)
    else:
        previous = project_path(cfg.init)
    for i, stage in enumerate(cfg.stages):
        out = run_dir / f"sft_{i}"
        if not (out / "config.json").is_file():
            print(f"== SFT stage {i + 1} of {len(cfg.stages)} from {previous} -> {out}", flush=True)
            policy = starting_policy(demos, preset=cfg.preset, init_from=previous, seed=stage.sft.seed,
                                     patch_positions=stage.patch_positions, layout_token=stage.layout_token,
                                     proprio=stage.proprio)
            train_sft(policy, demos, stage.sft, out_dir=out, progress=progress)
        previous = out
    # whole or not at all: publishing reads it
    return write_atomic_dir(run_dir / "sft", lambda tmp: shutil.copytree(previous, tmp, dirs_exist_ok=True))


def made_by(run_dir: str | Path, cfg: WarmStartConfig, command: str) -> dict:
    """How the warm start in ``run_dir`` was made (``made_by.json``)."""
    run_dir = Path(run_dir)
    index = load_index(run_dir / "demos")
    record = {
        "command": command,
        "demos": {"env_id": index["env_id"], "asset_pack": index["asset_pack"], "episodes_recorded": cfg.demos.episodes,
                  "episodes_kept": len(index["episodes"]), "seed": cfg.demos.seed,
                  "expert_kwargs": index.get("expert_kwargs", {}),
                  # as the demos recorded them (older demo folders do not: the recipe's then)
                  "env_kwargs": scene_options(index["env_kwargs"] if isinstance(index.get("env_kwargs"), dict)
                                              else demo_env_kwargs(cfg))},
        "init": f"a new {cfg.preset}, vision-pretrained" if cfg.init == "vision" else f"the checkpoint {cfg.init}",
    }
    if cfg.init == "vision":
        vision = json.loads((run_dir / "vision" / "vision_metrics.json").read_text())
        record["vision_pretraining"] = {"settings": {"slot_embeddings": cfg.vision.slot_embeddings,
                                                     **vision.get("settings", {})},
                                        **{k: vision[k] for k in VISION_METRICS if k in vision}}
    stages = []
    for i, stage in enumerate(cfg.stages):
        metrics = json.loads((run_dir / f"sft_{i}" / "sft_metrics.json").read_text())
        config = json.loads((run_dir / f"sft_{i}" / "config.json").read_text())
        settings = {"init": ("vision pretraining" if cfg.init == "vision" else cfg.init) if i == 0 else f"stage {i - 1}",
                    "patch_positions": config.get("patch_positions", "none"),
                    "layout_token": config.get("layout_token", "none"), "proprio": bool(config.get("proprio_dim")),
                    **metrics.get("settings", {})}
        stages.append({"settings": settings, **{k: metrics[k] for k in STAGE_METRICS if k in metrics}})
    record["stages"] = stages
    record["weights"] = "float16 (loads as float32)"
    return record


def publish_warm_start(run_dir: str | Path, dst: str | Path | None = None, command: str = "") -> Path:
    """``run_dir/sft`` in float16 at ``dst`` (default: the recipe's ``publish_to``; atomically) with
    ``made_by.json`` and ``sft_curve.png`` (every stage's curve, steps counted from the first
    stage's start)."""
    run_dir = Path(run_dir)
    recipe = run_dir / RECIPE_FILE
    if not recipe.is_file():
        raise FileNotFoundError(f"{run_dir} has no {RECIPE_FILE}: not a folder vla-train warm-start made")
    cfg = load_warm_start(recipe)
    if dst is None:
        if cfg.publish_to is None:
            raise ValueError(f"{recipe} names no publish_to; give the folder to write")
        dst = project_path(cfg.publish_to)
    record = made_by(run_dir, cfg, command or f"vla-train warm-start --config {recipe.name}")
    out = publish_half_precision(run_dir / "sft", dst, record)
    curve, offset = [], 0
    for stage in record["stages"]:
        curve += [{**point, "step": point["step"] + offset} for point in stage.get("curve") or []]
        offset += stage["steps"]
    if curve:
        sft_curve(curve, out / "sft_curve.png")
    return out
