"""Publishing a warm start made by ``scripts/make_warm_start.sh``: its last SFT stage in float16,
with ``made_by.json`` saying how it was made and one SFT curve over all its stages.

Everything in ``made_by.json`` is read from what the stages wrote into the run folder: the demo
folder's ``index.json``, the vision stage's ``vision_metrics.json`` and each SFT stage's
``sft_metrics.json`` (its settings and metrics) and ``config.json`` (its inputs). The run folder:

    demos/  vision/  sft_0/  sft_1/ ...  sft/ (a copy of the last stage)
"""

from __future__ import annotations

import json
from pathlib import Path

from vla_trainer.checkpoint import publish_half_precision
from vla_trainer.metrics_log import sft_curve

STAGE_METRICS = ("initial_loss", "final_loss", "final_token_accuracy", "final_action_l1", "action_l1_of_zero",
                 "steps", "scene_loss_weight", "first_frame_repeats", "release_frame_repeats", "final_scene_loss",
                 "curve")
VISION_METRICS = ("steps", "targets", "num_frames", "num_val_frames", "val_before", "val_after", "val_of_mean")


def stage_dirs(run_dir: Path) -> list[Path]:
    """``sft_0`` ... the stage that ``sft/`` is a copy of (its ``sft_metrics.json`` names it).

    Raises:
        FileNotFoundError: no ``sft/``, or a stage before it is missing.
    """
    copied = Path(json.loads((run_dir / "sft" / "sft_metrics.json").read_text())["checkpoint"]).name
    if not (copied.startswith("sft_") and copied[4:].isdigit()):
        raise FileNotFoundError(f"{run_dir / 'sft'} is not a copy of a stage sft_<i> (it came from {copied})")
    stages = [run_dir / f"sft_{i}" for i in range(int(copied[4:]) + 1)]
    missing = [p.name for p in stages if not (p / "sft_metrics.json").is_file()]
    if missing:
        raise FileNotFoundError(f"{run_dir}: stages {missing} are missing")
    return stages


def made_by(run_dir: str | Path, *, demo_episodes: int, demo_seed: int, env_kwargs: dict) -> dict:
    """How the warm start in ``run_dir`` was made (``made_by.json``)."""
    run_dir = Path(run_dir)
    index = json.loads((run_dir / "demos" / "index.json").read_text())
    vision = json.loads((run_dir / "vision" / "vision_metrics.json").read_text())
    stages = []
    for i, folder in enumerate(stage_dirs(run_dir)):
        metrics = json.loads((folder / "sft_metrics.json").read_text())
        config = json.loads((folder / "config.json").read_text())
        settings = {"init": "vision pretraining" if i == 0 else f"stage {i - 1}",
                    "patch_positions": config.get("patch_positions", "none"),
                    "layout_token": config.get("layout_token", "none"), "proprio": bool(config.get("proprio_dim")),
                    **metrics.get("settings", {})}
        stages.append({"settings": settings, **{k: metrics[k] for k in STAGE_METRICS if k in metrics}})
    return {
        "script": "scripts/make_warm_start.sh",
        "demos": {"env_id": index["env_id"], "asset_pack": index["asset_pack"], "episodes_recorded": demo_episodes,
                  "episodes_kept": len(index["episodes"]), "seed": demo_seed,
                  "expert_kwargs": index.get("expert_kwargs", {}), "env_kwargs": env_kwargs},
        "vision_pretraining": {
            "settings": {"init": "random (preset tiny-openvla-oft, learned slot embeddings)", **vision.get("settings", {})},
            **{k: vision[k] for k in VISION_METRICS if k in vision}},
        "stages": stages,
        "weights": "float16 (loads as float32)",
    }


def publish_warm_start(run_dir: str | Path, dst: str | Path, **made_by_kwargs) -> Path:
    """``run_dir/sft`` in float16 at ``dst`` (atomically) with ``made_by.json`` and ``sft_curve.png``
    (every stage's curve, steps counted from the first stage's start)."""
    run_dir = Path(run_dir)
    record = made_by(run_dir, **made_by_kwargs)
    out = publish_half_precision(run_dir / "sft", dst, record)
    curve, offset = [], 0
    for stage in record["stages"]:
        curve += [{**point, "step": point["step"] + offset} for point in stage.get("curve") or []]
        offset += stage["steps"]
    if curve:
        sft_curve(curve, out / "sft_curve.png")
    return out
