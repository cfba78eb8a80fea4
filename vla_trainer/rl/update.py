"""One policy (and critic) update on a rollout: PPO / GRPO mini-batches with gradient accumulation.

A rollout holds ``B = T * N`` samples (one per chunk step and env). Each of
``algorithm.update_epoch`` passes shuffles them and cuts them into global batches of
``actor.global_batch_size``; a global batch is one optimizer step, computed as
``global / micro`` forward-backward passes of ``actor.micro_batch_size`` samples whose
gradients accumulate. Every loss term is a weighted sum over the micro-batch divided by the
*global* batch's total weight, so the accumulated gradient is exactly the global batch's
masked mean, whatever the micro-batch size.

Granularities (see ``vla_trainer.algorithms.granularity``): log-probs are reduced to
``logprob_type`` (``[b]``, ``[b, C]`` or ``[b, C, A]``); advantages and masks at the reward
granularity are broadcast to them; tokens of sub-steps that did not belong to the chunk's episode
never count. An update whose loss is zero for every parameter (``has_learning_signal``) takes
no optimizer step. When the loss is the policy term alone (GRPO), a sample whose advantage is 0
wherever it counts adds exactly 0 to the gradient; ``contributing_samples`` leaves such samples
out of the forward-backward passes (and a global batch with none of them takes no step), which
is most of a GRPO rollout whose groups mostly scored alike. With ``algorithm.bc_coef`` > 0 every
global batch also adds the behaviour-cloning term on demonstrations (``behaviour_cloning``), so
every global batch takes a step.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Callable

import torch

from vla_trainer.algorithms import (
    actor_should_update,
    align_values,
    broadcast_advantages,
    entropy_bonus,
    kl_penalty,
    logprob_valid_mask,
    ppo_policy_loss,
    reduce_log_probs,
    value_loss,
)
from vla_trainer.config.schema import TrainConfig
from vla_trainer.models import ActionEvaluation, VLAPolicy
from vla_trainer.rl.behaviour_cloning import DemoBatches
from vla_trainer.rl.rollout import Rollout
from vla_trainer.rl.targets import Targets


class NonFiniteLossError(FloatingPointError):
    """A loss or gradient became NaN/inf; the optimizer step was not taken."""


def _batch_fields(rollout: Rollout, targets: Targets, idx: torch.Tensor, logprob_type: str):
    """Flattened per-sample tensors of samples ``idx`` (indices into ``T * N``)."""
    N = rollout.num_envs
    t, n = idx // N, idx % N
    valid = rollout.valid[t, n]  # [b, C]
    A = rollout.log_probs.shape[-1]
    lp_valid = logprob_valid_mask(valid, logprob_type, A)
    mask = broadcast_advantages(targets.mask[t, n], lp_valid) & lp_valid
    weights = None if targets.weights is None else targets.weights[t, n]  # already per log-prob entry
    token_mask = broadcast_advantages(targets.mask[t, n], rollout.log_probs[t, n]) & valid[..., None]
    return t, n, valid, mask, weights, token_mask


def _counted_mask(rollout: Rollout, targets: Targets, idx: torch.Tensor, logprob_type: str) -> torch.Tensor:
    """The log-prob entries of samples ``idx`` the policy loss's denominator counts:
    ``targets.denominator_mask`` (before the success-rate filter) broadcast like ``_batch_fields``'s mask."""
    N = rollout.num_envs
    t, n = idx // N, idx % N
    lp_valid = logprob_valid_mask(rollout.valid[t, n], logprob_type, rollout.log_probs.shape[-1])
    return broadcast_advantages(targets.denominator_mask[t, n], lp_valid) & lp_valid


def _on_cpu(ev: ActionEvaluation) -> ActionEvaluation:
    """The model's outputs next to the rollout's tensors (host memory); autograd follows the copy,
    so only these few numbers per sample cross from an accelerator, never the rollout."""
    if ev.log_probs.device.type == "cpu":
        return ev
    return ActionEvaluation(ev.log_probs.cpu(), ev.entropy.cpu(), None if ev.values is None else ev.values.cpu())


def _weight_sum(mask: torch.Tensor, weights: torch.Tensor | None) -> float:
    return float(mask.sum()) if weights is None else float((weights * mask).sum())


def has_learning_signal(targets: Targets, alg) -> bool:
    """False exactly when the update's loss is 0 for every parameter: no critic, no entropy or KL
    term, and every sample that counts has advantage 0 (GRPO groups whose trajectories all scored
    the same, or that the success-rate filter dropped). Such an update is skipped.

    Shapes:
        targets.advantages, targets.mask: ``[T, N]`` or ``[T, N, C]``.
    """
    contributes = contributing_samples(targets, alg)
    return contributes is None or bool(contributes.any())


def contributing_samples(targets: Targets, alg) -> torch.Tensor | None:
    """Which samples can move the weights, as a bool ``[T * N]``; None when every sample can.

    Only when the loss is the clipped policy term alone (no critic, entropy or KL term): its
    gradient for a sample is its advantage times the ratio's gradient, so a sample with advantage
    0 (or masked) wherever it counts contributes exactly 0. The global batch's denominators still
    count every sample, so the gradient equals the one computed over all samples.

    Shapes:
        targets.advantages, targets.mask: ``[T, N]`` or ``[T, N, C]``.
    """
    if alg.loss_type == "actor_critic" or alg.entropy_bonus != 0 or alg.kl_beta > 0:
        return None
    signal = targets.advantages.abs() * targets.mask
    return signal.reshape(signal.shape[0] * signal.shape[1], -1).sum(-1) > 0


def update_policy(policy: VLAPolicy, optimizer: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                  rollout: Rollout, targets: Targets, cfg: TrainConfig, iteration: int,
                  generator: torch.Generator, ref_policy: VLAPolicy | None = None, *,
                  demos: DemoBatches | None = None, rank: int = 0, world_size: int = 1,
                  all_reduce: Callable[[torch.Tensor], None] | None = None) -> dict:
    """Runs the update and returns mean metrics (losses, clip fractions, KL, grad norm).

    Data parallel: with ``world_size`` > 1 every rank holds the same rollout and model, runs
    micro-batches ``rank, rank + world_size, ...`` of each global batch, and ``all_reduce``
    (an in-place sum over ranks of one flat tensor) adds the gradients before the step. Loss
    denominators are the global batch's, so the summed gradient equals one process's; every
    rank then takes the same step. Metrics are this rank's share (``merge_rank_metrics``).
    ``demos``: the behaviour-cloning term's data (``algorithm.bc_coef`` > 0); rank 0 adds the
    term, so the summed gradient holds it once.
    """
    alg, actor = cfg.algorithm, cfg.actor
    sp = alg.sampling_params
    top_k = sp.top_k or None
    B = rollout.num_chunks * rollout.num_envs
    G, M = actor.global_batch_size, actor.micro_batch_size
    if B % G or G % M:
        raise ValueError(f"actor.global_batch_size={G} must divide the {B} samples and be a multiple of "
                         f"actor.micro_batch_size={M}")
    if (G // M) % world_size:
        raise ValueError(f"the {G // M} micro-batches of a global batch must split evenly over {world_size} "
                         "actor workers (actor.global_batch_size / actor.micro_batch_size)")
    train_actor = actor_should_update(iteration, actor.optim.critic_warmup_steps)
    clone = demos is not None and alg.bc_coef > 0 and train_actor
    if not clone and not has_learning_signal(targets, alg):
        # the gradient would be exactly zero; an optimizer step would only replay Adam's momentum
        return {"actor/trained": 0.0, "actor/no_signal": 1.0}
    use_critic = alg.loss_type == "actor_critic"
    contributes = contributing_samples(targets, alg)  # [B] or None
    C = rollout.rewards.shape[-1]
    logs: dict[str, list[float]] = defaultdict(list)
    flat = lambda x: x.reshape(B, *x.shape[2:])  # noqa: E731  [T, N, ...] -> [B, ...]
    tokens_all, old_lp_all = flat(rollout.action_token_ids), flat(rollout.log_probs)

    passes = 0  # global batches whose passes ran on rollout samples (the same count on every rank)
    policy.model.train()
    for _ in range(alg.update_epoch):
        order = torch.randperm(B, generator=generator)
        for start in range(0, B - G + 1, G):
            batch = order[start:start + G]
            fields = _batch_fields(rollout, targets, batch, alg.logprob_type)
            counted = fields[3] if targets.denominator_mask is None else _counted_mask(rollout, targets, batch,
                                                                                      alg.logprob_type)
            denom_pi = max(_weight_sum(counted, fields[4]), 1e-8)
            denom_tok = max(float(fields[5].sum()), 1e-8)
            value_mask = targets.mask[fields[0], fields[1]]
            denom_v = max(float(value_mask.sum()), 1e-8)
            # every rank holds the same targets, so all agree on what to skip (no collective hangs)
            work = batch if contributes is None else batch[contributes[batch]]
            if len(work) == 0 and not clone:
                continue  # a zero gradient: an optimizer step would only replay Adam's momentum
            passes += len(work) > 0  # a step of the behaviour-cloning term alone logs no policy metric
            # Logged metrics are means over the entries trained on (log-prob entries, tokens, values), summed
            # from micro-batch shares. Entropy and KL values are already shares of the global batch's
            # token count (their loss's denominator), so they are rescaled to the tokens trained on.
            wt, wn, _, w_mask, _, w_tokens = _batch_fields(rollout, targets, work, alg.logprob_type)
            n_entries = max(float(w_mask.sum()), 1e-8)
            n_values = max(float(targets.mask[wt, wn].sum()), 1e-8)
            tok_share = denom_tok / max(float(w_tokens.sum()), 1e-8)
            optimizer.zero_grad(set_to_none=True)
            bad = None
            for m0 in range(rank * M, len(work), M * world_size):
                idx = work[m0:m0 + M]
                t, n, valid, mask, weights, token_mask = _batch_fields(rollout, targets, idx, alg.logprob_type)
                inputs = policy.prepare(rollout.obs(t.numpy(), n.numpy()))
                ev = _on_cpu(policy.evaluate(inputs, tokens_all[idx].to(policy.device),
                                             temperature=sp.temperature_train, top_k=top_k))
                logp = reduce_log_probs(ev.log_probs, alg.logprob_type, valid)
                old_lp = reduce_log_probs(old_lp_all[idx], alg.logprob_type, valid)
                adv = broadcast_advantages(targets.advantages[t, n], logp)

                loss = torch.zeros(())
                if train_actor:
                    pl = ppo_policy_loss(logp, old_lp, adv, mask, clip_low=alg.clip_ratio_low,
                                         clip_high=alg.clip_ratio_high, weights=weights, denominator=denom_pi)
                    ent = entropy_bonus(ev.entropy, token_mask, coef=alg.entropy_bonus, denominator=denom_tok)
                    loss = loss + pl.loss + ent.loss
                    share = float(mask.sum()) / n_entries  # clipfrac, approx_kl: this micro-batch's mean
                    logs["actor/clipfrac"].append(float(pl.clipfrac) * share)
                    logs["actor/approx_kl"].append(float(pl.approx_kl) * share)
                    if mask.any():  # a micro-batch with no valid entry has no ratio (its statistic reads 1)
                        logs["actor/ratio_min"].append(float(pl.ratio_min))
                        logs["actor/ratio_max"].append(float(pl.ratio_max))
                    logs["actor/entropy"].append(float(ent.value) * tok_share)
                    logs["actor/policy_loss"].append(pl.loss.item())
                    if alg.kl_beta > 0 and ref_policy is not None:
                        with torch.no_grad():
                            ref = _on_cpu(ref_policy.evaluate(inputs, tokens_all[idx].to(policy.device),
                                                              temperature=sp.temperature_train, top_k=top_k))
                        kl = kl_penalty(ev.log_probs, ref.log_probs, token_mask, coef=alg.kl_beta,
                                        denominator=denom_tok)
                        loss = loss + kl.loss
                        logs["actor/kl_ref"].append(float(kl.value) * tok_share)
                if use_critic:
                    v = align_values(ev.values.float(), alg.reward_type, C)
                    vl = value_loss(v, targets.old_values[t, n], targets.returns[t, n], targets.mask[t, n],
                                    clip=alg.value_clip, huber_delta=alg.huber_delta, denominator=denom_v)
                    loss = loss + alg.value_loss_coef * vl.loss
                    logs["critic/value_loss"].append(vl.loss.item())
                    logs["critic/value_clipfrac"].append(float(vl.clipfrac) * float(targets.mask[t, n].sum()) / n_values)
                if not torch.isfinite(loss):
                    bad = (f"the loss became {float(loss.detach())} at iteration {iteration} (policy/value terms: "
                           f"{ {k: v[-1] for k, v in logs.items() if v} }); no optimizer step was taken")
                    break
                if loss.requires_grad:
                    loss.backward()
            # every rank draws, so that all generators stay in step (the next shuffle must agree)
            demo_idx = demos.draw(alg.bc_batch_size or M, generator) if clone else None
            if demo_idx is not None and rank == 0 and bad is None:
                bc = demos.loss(policy, demo_idx)
                logs["actor/bc_nll"].append(bc.item())
                if not torch.isfinite(bc):
                    bad = f"the behaviour-cloning loss became {bc.item()} at iteration {iteration}; no optimizer step was taken"
                else:
                    (alg.bc_coef * bc).backward()
            if all_reduce is not None:  # every rank joins, also one that hit a bad loss (no rank hangs)
                bad = _reduce_gradients(params, all_reduce, bad, iteration)
            if bad is not None:
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(bad)
            if not train_actor:  # warm-up: the value loss's gradient reaches the backbone too; keep only the head's
                for group in optimizer.param_groups:
                    if group.get("name") != "value_head":
                        for p in group["params"]:
                            p.grad = None
            grad_norm = torch.nn.utils.clip_grad_norm_([p for p in params if p.grad is not None], actor.optim.clip_grad)
            if not math.isfinite(float(grad_norm)):
                optimizer.zero_grad(set_to_none=True)
                raise NonFiniteLossError(f"the gradient norm became {float(grad_norm)} at iteration {iteration}; "
                                         "no optimizer step was taken")
            optimizer.step()
            logs["actor/grad_norm"].append(float(grad_norm))
    policy.model.eval()

    # per-step sums over micro-batches become per-global-batch values; average over the steps that ran passes
    out = {}
    for key, vals in logs.items():
        if not vals:
            continue
        out[key] = sum(vals) / passes if key in SUMMED_METRICS else _extreme_or_mean(key, vals)
    out["actor/trained"] = float(train_actor)
    if contributes is not None:  # the share of the rollout's samples the passes ran on
        out["actor/sample_fraction"] = float(contributes.float().mean())
    return out


SUMMED_METRICS = ("actor/policy_loss", "critic/value_loss", "actor/clipfrac", "actor/approx_kl",
                  "actor/entropy", "actor/kl_ref", "critic/value_clipfrac")
"""Metrics that are sums of micro-batch shares: each rank holds part of the sum."""


def merge_rank_metrics(per_rank: list[dict]) -> dict:
    """The metrics of one data-parallel update from each rank's ``update_policy`` result."""
    out = {}
    for key in dict.fromkeys(k for m in per_rank for k in m):  # a rank whose micro-batches held no entry logs less
        vals = [m[key] for m in per_rank if key in m]
        out[key] = sum(vals) if key in SUMMED_METRICS else _extreme_or_mean(key, vals)
    return out


def _extreme_or_mean(key: str, vals: list[float]) -> float:
    """``*_max`` metrics merge by max, ``*_min`` by min, the others by their mean."""
    return max(vals) if key.endswith("_max") else min(vals) if key.endswith("_min") else sum(vals) / len(vals)


def _reduce_gradients(params: list[torch.nn.Parameter], all_reduce: Callable[[torch.Tensor], None],
                      bad: str | None, iteration: int) -> str | None:
    """Sums gradients over ranks in one flat buffer (one collective, not one per tensor) and
    whether any rank saw a non-finite loss; returns the error every rank then raises.

    A parameter no rank gave a gradient keeps ``grad=None``, as in one process: the optimizer then
    leaves it alone (AdamW would decay it, and keep state for it, if it held a zero gradient)."""
    had = torch.tensor([float(p.grad is not None) for p in params], device=params[0].device)
    for p in params:
        if p.grad is None:  # every rank must contribute the same layout
            p.grad = torch.zeros_like(p)
    flag = torch.tensor([float(bad is not None)], device=params[0].device)
    flat = torch.cat([p.grad.reshape(-1).float() for p in params] + [had, flag])
    all_reduce(flat)
    offset = 0
    for p in params:
        p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
        offset += p.numel()
    for p, any_rank_had in zip(params, flat[offset:offset + len(params)]):
        if any_rank_had == 0:
            p.grad = None
    if flat[-1] > 0 and bad is None:
        bad = f"the loss became non-finite on another actor worker at iteration {iteration}; no optimizer step was taken"
    return bad
