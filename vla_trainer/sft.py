"""Supervised fine-tuning on scripted demonstrations: the warm start for RL.

Read top to bottom:

1. ``build_samples``: one sample per step ``t`` of every demo episode: the observation
   (image, state, instruction) and the target action chunk ``actions[t : t + C]`` (``C`` = the
   model's ``chunk_size``, 1 for OpenVLA), padded at the end of the episode by repeating the
   last action.
2. ``normalize_actions`` / ``target_token_ids``: env actions -> action token ids. The policy
   decodes tokens to normalised actions in ``[-1, 1]`` and un-normalises them with the
   checkpoint's q01/q99 statistics (``a_env = 0.5 (a + 1)(q99 - q01) + q01`` where ``mask``).
   SFT targets apply the inverse, ``a = 2 (a_env - q01) / (q99 - q01) - 1`` where ``mask``
   (identity elsewhere), clipped to ``[-1, 1]``, then the action tokenizer. With the tiny
   presets' identity statistics (q01 = -1, q99 = 1) this is a no-op.
3. ``train_sft``: AdamW on the mean negative log-likelihood of the target tokens under
   ``policy.evaluate(..., temperature=1.0, top_k=None)``, gradient clipping, a tqdm bar with
   the live loss, and a checkpoint written atomically (temp dir, then rename) to ``out_dir``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from vla_envs.demos import load_demos

from .checkpoint import save_model, write_atomic_dir
from .metrics_log import sft_curve
from .models import PolicyInputs, VLAPolicy
from .models.openvla import VLAOutput
from .scene import TARGETS_PER_BODY, SlotHead, scene_targets


@dataclass
class SFTSamples:
    """Training samples of a demo folder.

    Shapes:
        image: uint8 ``[M, H, W, 3]`` (at the model's image size after ``resize_images``).
        state: float32 ``[M, S]`` robot state (read by a model with ``proprio_dim = S``).
        instruction: ``M`` strings.
        action_chunk: float32 ``[M, C, 7]`` env actions ``actions[t : t + C]``, end-padded.
        scene: float32 ``[M, 5 K]`` scene targets (``scene.scene_targets``) of demos that record
            the expert's poses, else None.
        episode_step: int ``[M]``, each sample's step in its episode (0: the episode's first frame).
        holds_release: bool ``[M]``, True where the sample's action chunk holds the step at which
            the gripper first opens after closing (the release of a pick and place).
    """

    image: np.ndarray
    state: np.ndarray
    instruction: list[str]
    action_chunk: np.ndarray
    scene: np.ndarray | None = None
    episode_step: np.ndarray | None = None
    holds_release: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.instruction)

    def obs(self, idx: np.ndarray) -> dict:
        """The observation dict (as vla_envs returns it) of samples ``idx``."""
        return {
            "image": self.image[idx],
            "state": self.state[idx],
            "instruction": tuple(self.instruction[i] for i in idx),
        }


def action_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """``[T, A]`` -> ``[T, C, A]`` with row ``t`` = ``actions[t : t + C]``, the last action repeated."""
    T = len(actions)
    idx = np.minimum(np.arange(T)[:, None] + np.arange(chunk_size)[None, :], T - 1)
    return actions[idx].astype(np.float32)


def release_chunks(actions: np.ndarray, chunk_size: int) -> np.ndarray:
    """bool ``[T]``: True at steps ``t`` whose chunk ``actions[t : t + C]`` holds the release, the
    first step at which the gripper opens (action 6 <= 0) after it was closed (> 0). All False
    when the episode never releases."""
    closed = actions[:, 6] > 0
    opens = np.flatnonzero(~closed[1:] & closed[:-1]) + 1
    holds = np.zeros(len(actions), bool)
    if len(opens):
        holds[max(0, opens[0] - chunk_size + 1) : opens[0] + 1] = True
    return holds


DemoFolders = str | Path | Sequence[str | Path]


def load_episodes(demo_dirs: DemoFolders) -> list[dict[str, np.ndarray]]:
    """The episodes of one demo folder, or of several in the order given."""
    folders = [demo_dirs] if isinstance(demo_dirs, (str, Path)) else list(demo_dirs)
    return [e for folder in folders for e in load_demos(folder)[1]]


def build_samples(demo_dir: DemoFolders, chunk_size: int) -> SFTSamples:
    """One sample per step of every episode in ``demo_dir`` (one folder or several; see
    ``vla_envs.demos``).

    Raises:
        FileNotFoundError / ValueError: not a demo folder, or it holds no steps.
    """
    episodes = load_episodes(demo_dir)
    episodes = [e for e in episodes if len(e["action"]) > 0]
    if not episodes:
        raise ValueError(f"{demo_dir}: the demo folder holds no episodes with steps")
    return SFTSamples(
        image=np.concatenate([e["image"] for e in episodes]),
        state=np.concatenate([e["state"] for e in episodes]).astype(np.float32),
        instruction=[str(e["instruction"]) for e in episodes for _ in range(len(e["action"]))],
        action_chunk=np.concatenate([action_chunks(e["action"], chunk_size) for e in episodes]),
        scene=(np.concatenate([scene_targets(e["scene"]) for e in episodes])
               if all("scene" in e for e in episodes) else None),
        episode_step=np.concatenate([np.arange(len(e["action"])) for e in episodes]),
        holds_release=np.concatenate([release_chunks(e["action"], chunk_size) for e in episodes]),
    )


def state_stats(demo_dirs: DemoFolders, min_std: float = 1e-2) -> dict[str, list[float]]:
    """Mean and standard deviation of the robot state over every step of the demos, what a
    model's ``proprio_stats`` z-score ``obs["state"]`` with. ``min_std`` keeps a dimension that
    stands still in the demos (a fixed joint) from blowing up the smallest change later.

    Raises:
        ValueError: the demos hold no steps, or their states are not all of one width.
    """
    states = [np.asarray(e["state"], dtype=np.float64) for e in load_episodes(demo_dirs) if len(e["state"])]
    widths = {s.shape[-1] for s in states}
    if not states or len(widths) != 1:
        raise ValueError(f"{demo_dirs}: the demos need steps with a robot state of one width, got widths {widths}")
    state = np.concatenate(states)
    return {"mean": state.mean(0).tolist(), "std": np.maximum(state.std(0), min_std).tolist()}


def epoch_pool(samples: SFTSamples, first_frame_repeats: int, release_frame_repeats: int = 1) -> np.ndarray | int:
    """What one shuffled epoch draws from: every sample once, each episode's first frame
    ``first_frame_repeats`` times in all, and each sample whose chunk holds the release
    ``release_frame_repeats`` times in all (both 1: the plain epoch, ``len(samples)``)."""
    if first_frame_repeats == 1 and release_frame_repeats == 1:
        return len(samples)
    first = np.flatnonzero(samples.episode_step == 0)
    release = np.flatnonzero(samples.holds_release)
    return np.concatenate([np.arange(len(samples))] + [first] * (first_frame_repeats - 1)
                          + [release] * (release_frame_repeats - 1))


def resize_images(images: np.ndarray, size: int, batch: int = 256) -> np.ndarray:
    """uint8 ``[M, H, W, 3]`` -> uint8 ``[M, size, size, 3]`` (bilinear, antialiased); as is if already."""
    if images.shape[1:3] == (size, size):
        return images
    out = []
    for i in range(0, len(images), batch):
        x = torch.from_numpy(images[i : i + batch]).permute(0, 3, 1, 2).float()
        x = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out.append(x.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy())
    return np.concatenate(out)


def normalize_actions(
    actions: torch.Tensor, q01: torch.Tensor, q99: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """The inverse of ``unnormalize_actions``: env actions -> the tokenizer's ``[-1, 1]`` space.

    ``2 (a - q01) / (q99 - q01) - 1`` where ``mask`` (0 where ``q99 == q01``), unchanged elsewhere;
    clipped to ``[-1, 1]``. Shapes: actions ``[..., A]``; q01, q99, mask ``[A]``.
    """
    span = q99 - q01
    scaled = torch.where(span != 0, 2.0 * (actions - q01) / torch.where(span != 0, span, 1.0) - 1.0, 0.0)
    return torch.where(mask, scaled, actions).clamp(-1.0, 1.0)


def target_token_ids(policy: VLAPolicy, action_chunk: np.ndarray) -> torch.Tensor:
    """Env action chunks float ``[M, C, 7]`` -> action token ids int64 ``[M, C, 7]``."""
    actions = torch.as_tensor(action_chunk, dtype=torch.float32)
    normalized = normalize_actions(actions, policy.q01, policy.q99, policy.mask)
    return policy.core.action_tokenizer.encode(normalized)


def nll_loss(policy: VLAPolicy, inputs: PolicyInputs, tokens: torch.Tensor, label_sigma_bins: float = 0.0,
             out: VLAOutput | None = None) -> torch.Tensor:
    """Mean cross-entropy per target token (differentiable), at temperature 1 and no top-k, as
    ``policy.evaluate`` scores them; ``out``: the model's output on ``inputs`` if already computed.

    ``label_sigma_bins = 0``: the negative log-likelihood of the target bin. ``> 0``: against a
    Gaussian over the bins centred on the target bin, with this standard deviation in bins
    (a histogram loss for a continuous target: a near miss costs less than a far one, so the
    gradient says which way to move, not only "not this bin").
    """
    core = policy.core
    if out is None:
        out = core(inputs.pixel_values, inputs.input_ids, inputs.attention_mask, action_token_ids=tokens,
                   proprio=inputs.proprio)
    log_p = torch.log_softmax(out.action_logits, dim=-1)  # [N, C, A, n_bins]
    bins = core.action_token_indices(tokens)  # [N, C, A]
    if label_sigma_bins <= 0:
        return -log_p.gather(-1, bins.unsqueeze(-1)).mean()
    weights = gaussian_bin_targets(bins, log_p.shape[-1], label_sigma_bins)
    return -(weights * log_p).sum(-1).mean()


def scene_loss(head: nn.Module, out: VLAOutput, target: torch.Tensor) -> torch.Tensor:
    """Mean squared error of z-scored scene targets ``[N, 5 K]`` read by ``head`` from the action
    slots' last hidden states (``out`` computed with ``output_hidden_states=True``)."""
    return ((head(out.hidden_states[:, out.prefix_length :]) - target) ** 2).mean()


def gaussian_bin_targets(target: torch.Tensor, n_bins: int, sigma_bins: float) -> torch.Tensor:
    """A Gaussian over ``n_bins`` bins centred on each target bin, normalised over the bins.

    Shapes: target int64 ``[...]`` -> float32 ``[..., n_bins]``.
    """
    bins = torch.arange(n_bins, device=target.device, dtype=torch.float32)
    return torch.softmax(-0.5 * ((bins - target.unsqueeze(-1).float()) / sigma_bins) ** 2, dim=-1)


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
    """
    episodes = load_episodes(demo_dir)
    was_training = policy.model.training
    policy.model.eval()
    report = {}
    for t in steps:
        chosen = [e for e in episodes if len(e["action"]) > t]
        if not chosen:
            continue
        image = resize_images(np.stack([e["image"][t] for e in chosen]), policy.config.image_size)
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


LR_SCHEDULES = ("constant", "cosine")


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
    atomically (``write_atomic_dir``)."""

    def fill(tmp: Path) -> None:
        save_model(policy, tmp)
        if metrics is not None:
            (tmp / metrics_file).write_text(json.dumps(metrics, indent=1))
            if metrics.get("curve"):
                sft_curve(metrics["curve"], tmp / "sft_curve.png")

    return write_atomic_dir(out_dir, fill)


def train_sft(
    policy: VLAPolicy,
    demo_dir: DemoFolders,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int = 0,
    out_dir: str | Path | None = None,
    log_every: int = 10,
    max_grad_norm: float = 1.0,
    weight_decay: float = 0.0,
    progress: bool = True,
    eval_samples: int | None = 512,
    eval_every: int | None = None,
    warmup_steps: int = 0,
    lr_schedule: str = "constant",
    label_sigma_bins: float = 0.0,
    scene_loss_weight: float = 0.0,
    first_frame_repeats: int = 1,
    release_frame_repeats: int = 1,
) -> dict:
    """Behaviour cloning of the demos in ``demo_dir`` (one folder or several): minimises the target tokens' mean NLL.

    Deterministic given ``seed`` (minibatches are drawn from shuffled epochs of a seeded
    generator). Saves a checkpoint to ``out_dir`` at the end (None: no checkpoint).

    Returns:
        ``{"initial_loss", "final_loss", "initial_token_accuracy", "final_token_accuracy",
        "final_action_l1", "action_l1_of_zero",
        "num_samples", "steps", "checkpoint"}``; losses and accuracies are measured in eval mode
        before and after training, on ``eval_samples`` evenly spaced training samples (None: all).
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
    if first_frame_repeats < 1 or release_frame_repeats < 1:
        raise ValueError(f"first_frame_repeats and release_frame_repeats must be >= 1, "
                         f"got {first_frame_repeats} and {release_frame_repeats}")
    if steps < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"steps, batch_size and lr must be positive; got {steps}, {batch_size}, {lr}")
    if lr_schedule not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule {lr_schedule!r} is not one of {LR_SCHEDULES}")
    if label_sigma_bins < 0:
        raise ValueError(f"label_sigma_bins must be >= 0, got {label_sigma_bins}")
    if scene_loss_weight < 0:
        raise ValueError(f"scene_loss_weight must be >= 0, got {scene_loss_weight}")
    if warmup_steps < 0 or (eval_every is not None and eval_every < 1):
        raise ValueError(f"warmup_steps must be >= 0 and eval_every >= 1; got {warmup_steps}, {eval_every}")
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)

    # data: samples at the model's image size, targets as action token ids
    samples = build_samples(demo_dir, policy.chunk_size)
    samples.image = resize_images(samples.image, policy.config.image_size)
    tokens = target_token_ids(policy, samples.action_chunk)
    scene_head, scene_z = None, None
    if scene_loss_weight > 0:
        if samples.scene is None:
            raise ValueError(f"{demo_dir}: --scene-loss-weight needs demos with the expert's scene poses "
                             "(index.json 'scene_bodies'); record them with vla-envs collect-demos")
        scene = torch.as_tensor(samples.scene)
        scene_z = (scene - scene.mean(0)) / scene.std(0).clamp_min(1e-3)
        bodies = scene.shape[1] // len(TARGETS_PER_BODY)
        scene_head = SlotHead(policy.config.text_config.hidden_size, bodies, len(TARGETS_PER_BODY)).to(policy.device)

    before = evaluate_samples(policy, samples, tokens, batch_size, eval_samples)

    params = [p for p in policy.model.parameters() if p.requires_grad]
    params += list(scene_head.parameters()) if scene_head is not None else []
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lr_factor(i, steps, warmup_steps, lr_schedule)
    )
    policy.model.train()
    pool = epoch_pool(samples, first_frame_repeats, release_frame_repeats)
    order, pos = rng.permutation(pool), 0
    history, curve, scene_history = [], [], []
    bar = tqdm(range(1, steps + 1), desc="sft", disable=not progress, dynamic_ncols=True)
    for step in bar:
        # next minibatch of a shuffled epoch (reshuffle when it runs out)
        if pos + batch_size > len(order):
            order, pos = rng.permutation(pool), 0
        idx = order[pos : pos + batch_size]
        pos += len(idx)

        inputs = policy.prepare(samples.obs(idx))
        target = tokens[idx].to(policy.device)
        out = policy.core(inputs.pixel_values, inputs.input_ids, inputs.attention_mask,
                          action_token_ids=target, output_hidden_states=scene_head is not None,
                          proprio=inputs.proprio)
        loss = nll_loss(policy, inputs, target, label_sigma_bins, out)
        if scene_head is not None:
            grounding = scene_loss(scene_head, out, scene_z[idx].to(policy.device))
            scene_history.append(grounding.item())
            loss = loss + scene_loss_weight * grounding
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(params, max_grad_norm).item()
        optimizer.step()
        scheduler.step()

        history.append(loss.item())
        bar.set_postfix(loss=f"{history[-1]:.4f}")
        if log_every and step % log_every == 0:
            scene_note = f"  scene {np.mean(scene_history[-log_every:]):.4f}" if scene_history else ""
            bar.write(f"step {step}/{steps}  loss {np.mean(history[-log_every:]):.4f}  "
                      f"grad_norm {grad_norm:.3f}{scene_note}")
        if eval_every and step % eval_every == 0 and step < steps:
            point = {"step": step, **evaluate_samples(policy, samples, tokens, batch_size, eval_samples)}
            curve.append(point)
            bar.write(f"step {step}/{steps}  eval: loss {point['loss']:.4f}  token_acc "
                      f"{point['token_accuracy']:.3f}  action_l1 {point['action_l1']:.4f} "
                      f"(zero action {point['action_l1_of_zero']:.4f})")
    policy.model.eval()

    after = evaluate_samples(policy, samples, tokens, batch_size, eval_samples)
    metrics = {
        "initial_loss": before["loss"],
        "final_loss": after["loss"],
        "initial_token_accuracy": before["token_accuracy"],
        "final_token_accuracy": after["token_accuracy"],
        "final_action_l1": after["action_l1"],
        "action_l1_of_zero": after["action_l1_of_zero"],
        "num_samples": len(samples),
        "steps": steps,
        "scene_loss_weight": scene_loss_weight,
        "first_frame_repeats": first_frame_repeats,
        "release_frame_repeats": release_frame_repeats,
        "final_scene_loss": float(np.mean(scene_history[-(log_every or 1):])) if scene_history else None,
        "curve": curve + [{"step": steps, **after}] if eval_every else None,
        "checkpoint": None,
    }
    if out_dir is not None:
        metrics["checkpoint"] = str(out_dir)
        save_checkpoint(policy, out_dir, metrics)
    return metrics
