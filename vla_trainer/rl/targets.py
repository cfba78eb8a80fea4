"""From a rollout to per-sample training targets: advantages, value targets, masks, weights.

``compute_targets`` applies the algorithm's choices to a ``Rollout``:

    GAE (PPO)   rewards / flags reduced to ``reward_type``; GAE across auto-reset boundaries,
                bootstrapping with V(final observation) on truncation only; mask = transitions
                of a running episode; advantages optionally normalised over that mask.
    GRPO        trajectory score = sum of rewards until each env's first done; group-relative
                advantage broadcast to every step up to that done (the valid-action mask),
                exactly 0 for a group whose trajectories all scored the same; optional
                success-rate filter over groups and 1/T_i length-normalisation weights, taken
                over the valid log-prob entries so that every trajectory weighs 1 (paper Eq. 12)
                whatever the log-probs' granularity.

Shapes: ``[T, N]`` for chunk-level rewards, ``[T, N, C]`` for action-level (the "reward
granularity" ``R``); ``values`` are the critic's ``[T, N, V]``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla_trainer.algorithms import (
    align_values,
    broadcast_advantages,
    compute_action_level_gae,
    compute_gae,
    first_done_mask,
    group_advantages,
    length_normalization_weights,
    logprob_valid_mask,
    reduce_flags,
    reduce_rewards,
    success_rate_filter,
    trajectory_scores,
    uniform_groups,
)
from vla_trainer.config.schema import AlgorithmConfig
from vla_trainer.rl.rollout import Rollout


@dataclass
class Targets:
    """Training targets at the reward granularity ``R`` (``[T, N]`` or ``[T, N, C]``)."""

    advantages: torch.Tensor
    returns: torch.Tensor | None
    old_values: torch.Tensor | None
    mask: torch.Tensor
    """bool: samples that count in the loss."""
    weights: torch.Tensor | None
    """GRPO length normalisation: loss weights per log-prob entry (``[T, N]``, ``[T, N, C]`` or
    ``[T, N, C, A]`` by ``logprob_type``), summing to 1 over each trajectory; or None."""
    stats: dict
    denominator_mask: torch.Tensor | None = None
    """GRPO with the success-rate filter: ``mask`` before the filter. The policy loss is divided by
    what it counts, as the reference's masked mean is, so a filtered group weighs 0 without
    enlarging the others' gradient (an update that keeps 1 group in 8 is not 8 times stronger)."""


def compute_targets(rollout: Rollout, alg: AlgorithmConfig, group_size: int = 1) -> Targets:
    r = reduce_rewards(rollout.rewards, alg.reward_type, rollout.valid)
    term = reduce_flags(rollout.terminated, alg.reward_type, rollout.valid)
    trunc = reduce_flags(rollout.truncated, alg.reward_type, rollout.valid)
    valid = reduce_flags(rollout.valid, alg.reward_type)
    C = rollout.rewards.shape[-1]
    stats: dict = {}

    if alg.adv_type == "gae":
        values = align_values(rollout.values, alg.reward_type, C)
        if alg.reward_type == "chunk_level":
            out = compute_gae(r, values, term, trunc, rollout.final_values, rollout.next_values,
                              gamma=alg.gamma, lam=alg.gae_lambda, valid=valid)
        else:
            final = rollout.final_values[..., None].expand_as(values)
            out = compute_action_level_gae(r, values, term, trunc, final, rollout.next_values,
                                           gamma=alg.gamma, lam=alg.gae_lambda, valid=valid)
        adv = out.advantages
        if alg.normalize_advantages and valid.any():
            mean, std = adv[valid].mean(), adv[valid].std(unbiased=False)
            adv = torch.where(valid, (adv - mean) / (std + 1e-8), torch.zeros_like(adv))
        return Targets(adv, out.returns, values, valid, None, stats)

    # GRPO: one trajectory per env, scored up to its first done
    done = term | trunc
    mask = first_done_mask(done) & valid
    scores = trajectory_scores(torch.where(mask, r, torch.zeros_like(r)), done & mask)
    adv_traj = group_advantages(scores, group_size)
    stats["grpo/score_mean"] = float(scores.mean())
    # groups that move the policy: not all alike (their advantages are exactly 0, so the update
    # skips them) and, with the filter, kept by it (dropped from the mask)
    keep = ~uniform_groups(scores, group_size)
    stats["grpo/groups_uniform"] = float((~keep).float().mean())
    unfiltered = None
    if alg.success_rate_filter:
        kept = success_rate_filter(scores, group_size, alg.filter_low, alg.filter_high)
        keep_env = kept.repeat_interleave(group_size)
        unfiltered = mask
        mask = mask & keep_env.view(1, -1, *([1] * (mask.dim() - 2)))
        keep &= kept
    stats["grpo/groups_kept"] = float(keep.float().mean())
    shape = (1, -1) + (1,) * (mask.dim() - 2)
    adv = torch.where(mask, adv_traj.view(shape).expand_as(mask).to(torch.float32), torch.zeros(mask.shape))
    weights = None
    if alg.length_normalization:
        # 1/T_i over the entries the ratio is taken of: a chunk cut short by its episode's end
        # has fewer valid log-probs and must weigh less than a full one
        # (on the mask before the filter: a filtered trajectory keeps its weights for the denominator)
        lp_valid = logprob_valid_mask(rollout.valid, alg.logprob_type, rollout.log_probs.shape[-1])
        counted = mask if unfiltered is None else unfiltered
        weights = length_normalization_weights(broadcast_advantages(counted, lp_valid) & lp_valid)
    return Targets(adv, None, None, mask, weights, stats, unfiltered)


def concat_targets(targets: list[Targets]) -> Targets:
    """Targets of side-by-side rollouts (``concat_rollouts``) along the env axis; stats averaged."""
    if len(targets) == 1:
        return targets[0]
    cat = lambda name: None if getattr(targets[0], name) is None else torch.cat(  # noqa: E731
        [getattr(t, name) for t in targets], dim=1)
    stats = {k: sum(t.stats[k] for t in targets) / len(targets) for k in targets[0].stats}
    return Targets(cat("advantages"), cat("returns"), cat("old_values"), cat("mask"), cat("weights"), stats,
                   cat("denominator_mask"))
