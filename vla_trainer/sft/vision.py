"""Vision pretraining on simulated frames: teach the vision towers where things are.

OpenVLA's towers come pretrained (DINOv2, SigLIP on web images); a tiny preset's start random,
and behaviour cloning alone does not teach them to see a 6-8 pixel object (the warm start's
reaching error stays at the zero action's in the lateral direction). This stage stands in for
that pretraining: the towers and the projector learn to regress, from one frame, the positions
and yaws of the bodies the scripted expert saw (the demos' privileged ``scene`` poses). The
labels exist only in simulation and only for training; the policy never receives them.

Read top to bottom: ``pretrain_vision``: AdamW on the mean squared error of z-scored scene
targets (``scene.py``) predicted by a ``PatchHead`` on the projector's patches, over the training
frames; validation on the frames of held-out episodes (errors in cm and degrees); then the whole
model is saved with ``vision_metrics.json`` (its language model untouched) for
``vla-train sft --init-from``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from vla_envs.demos import load_index
from vla_trainer.checkpoint import check_model_out_dir
from vla_trainer.data import (TARGETS_PER_BODY, DemoFolders, demo_folders, load_episodes, scene_targets,
                              stack_images)
from vla_trainer.models import VLAPolicy
from vla_trainer.models.vision import images_to_pixel_values
from vla_trainer.sft.heads import PatchHead, scene_errors
from vla_trainer.sft.train import save_checkpoint


def load_scene_frames(demo_dirs: DemoFolders, image_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[str]]:
    """Every frame of the demos with its targets.

    Returns:
        images uint8 ``[M, S, S, 3]``, targets float32 ``[M, 5 K]``, episode index int ``[M]``,
        target names (``"object.x"``, ...).

    Raises:
        ValueError: an episode has no ``scene`` poses (demos recorded without a scripted expert,
            or before the format had them), or the folders name different bodies.
    """
    bodies = None
    for folder in demo_folders(demo_dirs):
        found = load_index(folder).get("scene_bodies")
        if not found:
            raise ValueError(f"{folder}: the demos record no scene poses (index.json has no 'scene_bodies'); "
                             "record them with vla-envs collect-demos (scripted expert)")
        if bodies is not None and found != bodies:
            raise ValueError(f"{folder}: scene_bodies {found} differ from {bodies} of the folders before it")
        bodies = found
    episodes = [e for e in load_episodes(demo_dirs) if len(e["action"])]
    if not episodes:
        raise ValueError(f"{demo_dirs}: the demo folders hold no episodes with steps")
    images = stack_images(episodes, image_size)
    targets = np.concatenate([scene_targets(e["scene"]) for e in episodes])
    episode = np.concatenate([np.full(len(e["action"]), i) for i, e in enumerate(episodes)])
    names = [f"{b}.{t}" for b in bodies for t in TARGETS_PER_BODY]
    return images, targets, episode, names


def pretrain_vision(
    policy: VLAPolicy,
    demo_dir: DemoFolders,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    val_fraction: float = 0.1,
    eval_every: int = 100,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Trains ``policy``'s vision backbone and projector to regress the demos' scene targets.

    The last ``val_fraction`` of episodes are held out. Deterministic given ``seed``.

    Returns:
        ``{"targets", "num_frames", "num_val_frames", "steps", "val_before", "val_after",
        "val_of_mean", "pretrain_curve", "checkpoint"}``; the ``val_*`` are ``scene_errors`` on the held-out
        frames (``val_of_mean``: predicting the training mean, the error to beat).
    """
    if steps < 1 or batch_size < 1 or lr <= 0 or not 0 < val_fraction < 1:
        raise ValueError(f"steps, batch_size, lr must be positive and 0 < val_fraction < 1; got "
                         f"{steps}, {batch_size}, {lr}, {val_fraction}")
    if out_dir is not None:
        check_model_out_dir(out_dir)  # before the training whose result would be lost
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    core, config = policy.core, policy.config
    images, targets, episode, names = load_scene_frames(demo_dir, config.image_size)
    n_val_episodes = max(1, int(round(val_fraction * (episode.max() + 1))))
    val = episode > episode.max() - n_val_episodes
    if val.all():
        raise ValueError("too few episodes to hold any out for validation; record more demos")
    train_idx, val_idx = np.flatnonzero(~val), np.flatnonzero(val)

    target = torch.as_tensor(targets)
    mean, std = target[train_idx].mean(0), target[train_idx].std(0).clamp_min(1e-3)
    device = policy.device
    vision = nn.ModuleDict({"backbone": core.vision_backbone, "projector": core.projector})
    head = PatchHead(core.vision_backbone.num_patches, config.text_config.hidden_size, len(names)).to(device)

    def predict(idx: np.ndarray) -> torch.Tensor:
        """Scene targets of frames ``idx``, ``[len(idx), 5 K]`` (z-scored)."""
        pixels = images_to_pixel_values(torch.as_tensor(images[idx]), config.image_mean, config.image_std)
        return head(core.projector(core.vision_backbone(pixels.to(device)))).cpu()

    @torch.no_grad()
    def validate() -> dict[str, float]:
        vision.eval(), head.eval()
        pred = torch.cat([predict(val_idx[i : i + 256]) for i in range(0, len(val_idx), 256)])
        vision.train(), head.train()
        return scene_errors(pred * std + mean, target[val_idx], names)

    params = list(vision.parameters()) + list(head.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr)
    before = validate()
    curve = []
    vision.train(), head.train()
    bar = tqdm(range(1, steps + 1), desc="pretrain-vision", disable=not progress, dynamic_ncols=True)
    for step in bar:
        idx = rng.choice(train_idx, size=min(batch_size, len(train_idx)), replace=False)
        loss = ((predict(idx) - (target[idx] - mean) / std) ** 2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        bar.set_postfix(loss=f"{loss.item():.4f}")
        if step % eval_every == 0 or step == steps:
            curve.append({"step": step, "loss": loss.item(), **validate()})
            bar.write(f"step {step}/{steps}  loss {loss.item():.4f}  held-out " +
                      "  ".join(f"{k} {v:.2f}" for k, v in curve[-1].items() if k not in ("step", "loss")))
    vision.eval()
    policy.model.eval()
    metrics = {
        "targets": names, "num_frames": len(images), "num_val_frames": len(val_idx), "steps": steps,
        "val_before": before, "val_after": curve[-1] if curve else validate(),
        "val_of_mean": scene_errors(mean.expand(len(val_idx), -1), target[val_idx], names),
        "pretrain_curve": curve, "checkpoint": None,
        "settings": {"batch_size": batch_size, "lr": lr, "seed": seed, "val_fraction": val_fraction,
                     "eval_every": eval_every},
    }
    if out_dir is not None:
        metrics["checkpoint"] = str(out_dir)
        save_checkpoint(policy, out_dir, metrics, "vision_metrics.json")
    return metrics
