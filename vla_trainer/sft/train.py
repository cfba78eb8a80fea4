"""Supervised fine-tuning on scripted demonstrations: the warm start for RL.

Read top to bottom:

1. The samples (``vla_trainer.data.build_samples``): one per step ``t`` of every demo episode,
   the observation and the target action chunk ``actions[t : t + C]``.
2. Their targets (``vla_trainer.models.token_targets``): env actions -> action token ids through
   the checkpoint's q01/q99 normalisation and the action tokenizer.
3. ``train_sft``: AdamW on the mean negative log-likelihood of the target tokens under
   ``policy.evaluate(..., temperature=1.0, top_k=None)``, gradient clipping, a tqdm bar with
   the live loss, and a checkpoint written atomically (temp dir, then rename) to ``out_dir``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from vla_trainer.checkpoint import check_model_out_dir, save_model, write_atomic_dir
from vla_trainer.config.sft import SFTConfig
from vla_trainer.data import (TARGETS_PER_BODY, DemoFolders, SFTSamples, build_samples, demos_env, epoch_pool,
                               resize_images, trained_episodes)
from vla_trainer.metrics_log import sft_curve
from vla_trainer.models import VLAPolicy
from vla_trainer.models.openvla import VLAOutput
from vla_trainer.models.token_targets import nll_loss, target_token_ids
from vla_trainer.sft.heads import SlotHead


def scene_loss(head: nn.Module, out: VLAOutput, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of z-scored scene targets ``[N, 5 K]`` read by ``head`` from the action
    slots' last hidden states (``out`` computed with ``output_hidden_states=True``)."""
    return ((head(out.hidden_states[:, out.prefix_length :]) - target) ** 2).mean()


@torch.no_grad()
def evaluate_samples(policy: VLAPolicy, samples: SFTSamples, tokens: torch.Tensor, batch_size: int,
                     max_samples: int | None = None) -> dict:
    """Mean NLL, greedy token accuracy and greedy action L1 error (eval mode) over all samples, or
    over an evenly spaced subset of ``max_samples`` of them.

    ``action_l1_of_zero`` is the L1 error of always predicting a zero action: a policy whose
    ``action_l1`` is no better has learned the actions' mode, not to react to what it sees
    (token accuracy alone hides this when most target actions are near zero)."""
    was_training = policy.model.training
    policy.model.eval()
    nll_sum, correct, count, l1_sum, l1_zero_sum = 0.0, 0, 0, 0.0, 0.0
    chosen = np.arange(len(samples))
    if max_samples is not None and len(samples) > max_samples:
        chosen = np.linspace(0, len(samples) - 1, max_samples).round().astype(int)
    for start in range(0, len(chosen), batch_size):
        idx = chosen[start:start + batch_size]
        inputs = policy.prepare(samples.obs(idx))
        target = tokens[idx].to(policy.device)
        ev = policy.evaluate(inputs, target, temperature=1.0, top_k=None)
        sample = policy.act(inputs, greedy=True)
        greedy = sample.action_token_ids
        nll_sum += float(-ev.log_probs.sum())
        correct += int((greedy == target).sum())
        count += target.numel()
        expert = torch.as_tensor(samples.action_chunk[idx])
        l1_sum += float((sample.actions.cpu() - expert).abs().sum())
        l1_zero_sum += float(expert.abs().sum())
    policy.model.train(was_training)
    return {"loss": nll_sum / count, "token_accuracy": correct / count,
            "action_l1": l1_sum / count, "action_l1_of_zero": l1_zero_sum / count}


@torch.no_grad()
def action_error_by_step(policy: VLAPolicy, demo_dir: DemoFolders, steps: tuple[int, ...] = (0, 1, 3),
                         batch_size: int = 64) -> dict[int, dict]:
    """Greedy error of the first action of the chunk, per action dimension, at episode step ``t``.

    ``evaluate_samples`` averages over every step of every episode, where most expert actions are
    near zero; this separates the steps that decide an episode (``t = 0`` is the reach towards
    the object) and the dimensions (a policy can get x right and y wrong).

    Returns:
        ``{t: {"policy": [A], "zero": [A], "episodes": n}}``: mean ``|a_policy - a_expert|`` and
        ``|a_expert|`` over the ``n`` episodes longer than ``t`` (``t`` without any is left out).

    Raises:
        FileNotFoundError / ValueError: as ``trained_episodes`` (no successful episode, actions not 7-D).
    """
    episodes = trained_episodes(demo_dir)  # the episodes SFT learns from
    was_training = policy.model.training
    policy.model.eval()
    report = {}
    for t in steps:
        chosen = [e for e in episodes if len(e["action"]) > t]
        if not chosen:
            continue
        # folders recorded at different sizes (as SFT takes them): each frame at the model's size first
        image = np.concatenate([resize_images(e["image"][t:t + 1], policy.config.image_size) for e in chosen])
        expert = np.stack([e["action"][t] for e in chosen]).astype(np.float32)  # [n, A]
        predicted = []
        for start in range(0, len(chosen), batch_size):
            part = chosen[start:start + batch_size]
            obs = {"image": image[start:start + batch_size],
                   "state": np.stack([e["state"][t] for e in part]).astype(np.float32),
                   "instruction": tuple(str(e["instruction"]) for e in part)}
            predicted.append(policy.act(policy.prepare(obs), greedy=True).actions[:, 0].cpu().numpy())
        predicted = np.concatenate(predicted)  # [n, A]
        report[t] = {"policy": np.abs(predicted - expert).mean(0).tolist(),
                     "zero": np.abs(expert).mean(0).tolist(), "episodes": len(chosen)}
    policy.model.train(was_training)
    return report


def lr_factor(step: int, steps: int, warmup_steps: int, schedule: str) -> float:
    """Multiplier of the base learning rate for optimizer step ``step`` (0-based) of ``steps``."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    if schedule == "constant":
        return 1.0
    progress = (step - warmup_steps) / max(1, steps - warmup_steps - 1)
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def save_checkpoint(policy: VLAPolicy, out_dir: str | Path, metrics: dict | None = None,
                    metrics_file: str = "sft_metrics.json") -> Path:
    """Saves the model (LoRA adapters if it is a peft model), tokenizer and ``metrics``
    (``metrics_file``, and ``sft_curve.png`` when they hold a curve) to ``out_dir``,
    atomically (``write_atomic_dir``). ``out_dir`` must pass ``check_model_out_dir``."""

    def fill(tmp: Path) -> None:
        save_model(policy, tmp)
        if metrics is not None:
            (tmp / metrics_file).write_text(json.dumps(metrics, indent=1))
            if metrics.get("curve"):
                sft_curve(metrics["curve"], tmp / "sft_curve.png")

    return write_atomic_dir(check_model_out_dir(out_dir), fill)


def train_sft(
    policy: VLAPolicy,
    demo_dir: DemoFolders,
    cfg: SFTConfig,
    *,
    out_dir: str | Path | None = None,
    progress: bool = True,
) -> dict:
    """Behaviour cloning of the demos in ``demo_dir`` (one folder or several): minimises the target tokens' mean NLL.

    ``cfg`` holds every setting (``config.sft.SFTConfig``, checked when it is made). Deterministic
    given ``cfg.seed`` (minibatches are drawn from shuffled epochs of a seeded generator). Saves a
    checkpoint to ``out_dir`` at the end (None: no checkpoint).

    Returns:
        ``{"initial_loss", "final_loss", "initial_token_accuracy", "final_token_accuracy",
        "final_action_l1", "action_l1_of_zero",
        "num_samples", "steps", "settings", "checkpoint"}`` (``settings``: ``cfg`` as a dict);
        losses and accuracies are measured in eval mode before and after training, on
        ``eval_samples`` evenly spaced training samples (None: all).
        With ``eval_every`` the same measurement every N steps is printed and returned as
        ``"curve"`` (a list of ``{"step", "loss", "token_accuracy", "action_l1", "action_l1_of_zero"}``).

    The learning rate rises linearly over ``warmup_steps``, then stays (``lr_schedule="constant"``)
    or follows a cosine to 10 % of ``lr`` at the last step (``"cosine"``). ``label_sigma_bins``:
    see ``nll_loss`` (the reported losses are always the plain NLL).

    ``scene_loss_weight > 0`` adds that times ``scene_loss``: a ``SlotHead`` (discarded at the
    end) regresses the expert's z-scored scene poses from the action slots' hidden states, a
    grounding task co-trained with the actions. It gives every frame a dense target that depends
    on where the object is, so the slots learn to attend to it; the actions alone mostly teach
    what is the same in every episode. Needs demos with scene poses. ``"final_scene_loss"`` is
    then the mean of the last ``log_every`` steps.

    ``first_frame_repeats > 1`` draws each episode's first frame that many times per epoch. The
    first chunk of a scripted reach carries the one decision that depends on where the object
    is, and it is one frame of about 24 per episode; the evaluation frames stay uniform.
    ``release_frame_repeats > 1`` does the same for the samples whose action chunk holds the
    release (``release_chunks``): the lowering over the plate and the opening, the last phase of
    a demo and the one RL from a warm start reaches least often.
    """
    if out_dir is not None:
        check_model_out_dir(out_dir)  # before the training whose result would be lost
    torch.manual_seed(cfg.seed)
    rng = np.random.default_rng(cfg.seed)

    # data: samples at the model's image size, targets as action token ids
    samples = build_samples(demo_dir, policy.chunk_size, policy.config.image_size)
    tokens = target_token_ids(policy, samples.action_chunk)
    scene_head, scene_z = None, None
    if cfg.scene_loss_weight > 0:
        if samples.scene is None:
            raise ValueError("--scene-loss-weight needs demos with the expert's scene poses "
                             "(index.json 'scene_bodies'); record them with vla-envs collect-demos")
        scene = torch.as_tensor(samples.scene)
        scene_z = (scene - scene.mean(0)) / scene.std(0).clamp_min(1e-3)
        bodies = scene.shape[1] // len(TARGETS_PER_BODY)
        scene_head = SlotHead(policy.config.text_config.hidden_size, bodies, len(TARGETS_PER_BODY)).to(policy.device)

    before = evaluate_samples(policy, samples, tokens, cfg.batch_size, cfg.eval_samples)

    params = [p for p in policy.model.parameters() if p.requires_grad]
    params += list(scene_head.parameters()) if scene_head is not None else []
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lr_factor(i, cfg.steps, cfg.warmup_steps, cfg.lr_schedule)
    )
    policy.model.train()
    pool = epoch_pool(samples, cfg.first_frame_repeats, cfg.release_frame_repeats)
    order, pos = rng.permutation(pool), 0
    history, curve, scene_history = [], [], []
    bar = tqdm(range(1, cfg.steps + 1), desc="sft", disable=not progress, dynamic_ncols=True)
    for step in bar:
        # next minibatch of a shuffled epoch (reshuffle when it runs out)
        if pos + cfg.batch_size > len(order):
            order, pos = rng.permutation(pool), 0
        idx = order[pos : pos + cfg.batch_size]
        pos += len(idx)

        inputs = policy.prepare(samples.obs(idx))
        target = tokens[idx].to(policy.device)
        out = policy.core(inputs.pixel_values, inputs.input_ids, inputs.attention_mask,
                          action_token_ids=target, output_hidden_states=scene_head is not None,
                          proprio=inputs.proprio)
        loss = nll_loss(policy, inputs, target, cfg.label_sigma_bins, out)
        if scene_head is not None:
            grounding = scene_loss(scene_head, out, scene_z[idx].to(policy.device))
            scene_history.append(grounding.item())
            loss = loss + cfg.scene_loss_weight * grounding
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm).item()
        optimizer.step()
        scheduler.step()

        history.append(loss.item())
        bar.set_postfix(loss=f"{history[-1]:.4f}")
        if cfg.log_every and step % cfg.log_every == 0:
            scene_note = f"  scene {np.mean(scene_history[-cfg.log_every:]):.4f}" if scene_history else ""
            bar.write(f"step {step}/{cfg.steps}  loss {np.mean(history[-cfg.log_every:]):.4f}  "
                      f"grad_norm {grad_norm:.3f}{scene_note}")
        if cfg.eval_every and step % cfg.eval_every == 0 and step < cfg.steps:
            point = {"step": step, **evaluate_samples(policy, samples, tokens, cfg.batch_size, cfg.eval_samples)}
            curve.append(point)
            bar.write(f"step {step}/{cfg.steps}  eval: loss {point['loss']:.4f}  token_acc "
                      f"{point['token_accuracy']:.3f}  action_l1 {point['action_l1']:.4f} "
                      f"(zero action {point['action_l1_of_zero']:.4f})")
    policy.model.eval()

    after = evaluate_samples(policy, samples, tokens, cfg.batch_size, cfg.eval_samples)
    metrics = {
        "initial_loss": before["loss"],
        "final_loss": after["loss"],
        "initial_token_accuracy": before["token_accuracy"],
        "final_token_accuracy": after["token_accuracy"],
        "final_action_l1": after["action_l1"],
        "action_l1_of_zero": after["action_l1_of_zero"],
        "num_samples": len(samples),
        "steps": cfg.steps,
        "scene_loss_weight": cfg.scene_loss_weight,
        "first_frame_repeats": cfg.first_frame_repeats,
        "release_frame_repeats": cfg.release_frame_repeats,
        "final_scene_loss": float(np.mean(scene_history[-(cfg.log_every or 1):])) if scene_history else None,
        "curve": curve + [{"step": cfg.steps, **after}] if cfg.eval_every else None,
        "settings": cfg.to_dict(),
        "unnorm_key": policy.unnorm_key,  # the statistics its targets were normalised with (recorded_unnorm_key)
        **demos_env(demo_dir),  # the env the model was trained for, and how its images were made (camera_crop)
        "checkpoint": None,
    }
    if out_dir is not None:
        metrics["checkpoint"] = str(out_dir)
        save_checkpoint(policy, out_dir, metrics)
    return metrics
