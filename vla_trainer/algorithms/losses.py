"""PPO / GRPO losses: clipped policy objective, clipped Huber value loss, entropy bonus, KL penalty.

Every loss takes a bool ``mask`` of the entries that count and optional per-entry ``weights``,
and reduces with ``masked_mean``:

    sum(loss * mask * weights) / denominator,    denominator = sum(mask * weights) by default

* ``weights=None``: the mean over valid entries ("token-mean": each valid token, action or
  chunk, whichever granularity the tensors have, counts once).
* ``weights=length_normalization_weights(mask)``: each trajectory's mean, averaged over
  trajectories (GRPO, paper Eq. 12).
* ``denominator``: a fixed normaliser (e.g. the valid-entry count of the whole batch) so that
  gradients accumulated over micro-batches add up to the full-batch mean.

All tensors of one call have the same shape (broadcast coarser advantages and masks first with
``broadcast_advantages``). The returned ``loss`` is to be minimised; diagnostics are detached.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class PolicyLoss(NamedTuple):
    """What ``ppo_policy_loss`` returns; all scalars, all but ``loss`` detached."""

    loss: torch.Tensor
    """Clipped surrogate, negated (minimise)."""
    clipfrac: torch.Tensor
    """Fraction of valid entries whose ratio lies outside ``[1 - clip_low, 1 + clip_high]``."""
    approx_kl: torch.Tensor
    """k3 estimate of KL(old || new) over valid entries: ``mean((r - 1) - log r)``."""
    ratio_mean: torch.Tensor
    ratio_min: torch.Tensor
    ratio_max: torch.Tensor


class ValueLoss(NamedTuple):
    """What ``value_loss`` returns; ``clipfrac`` is detached."""

    loss: torch.Tensor
    """``max(huber(v - R), huber(v_clipped - R))`` reduced over the mask (no 0.5 or coefficient)."""
    clipfrac: torch.Tensor
    """Fraction of valid entries whose prediction moved more than ``clip`` from the old value."""


class Penalty(NamedTuple):
    """A regulariser: ``loss`` to add to the total loss, ``value`` (detached) to log."""

    loss: torch.Tensor
    value: torch.Tensor


def _check_same_shape(**tensors: torch.Tensor | None) -> None:
    """Raise a ValueError listing every shape unless the given tensors (None skipped) agree.

    Shapes:
        tensors: all the same shape.
    """
    shapes = {k: tuple(v.shape) for k, v in tensors.items() if v is not None}
    if len(set(shapes.values())) > 1:
        detail = ", ".join(f"{k} {list(s)}" for k, s in shapes.items())
        raise ValueError(
            f"shapes differ: {detail}; broadcast coarser tensors first (broadcast_advantages)"
        )


def masked_mean(
    x: torch.Tensor,
    mask: torch.Tensor,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum(x * w) / sum(w)`` with ``w = mask * weights``; 0 when nothing is valid.

    Entries outside ``mask`` never reach the result, even if they are inf or NaN.

    Args:
        x: values to average.
        mask: bool, entries that count.
        weights: per-entry weights (None: 1).
        denominator: divide by this instead of ``sum(w)``.

    Returns:
        A scalar tensor (differentiable in ``x``).

    Shapes:
        x, mask, weights: the same shape ``[...]``. Returns ``[]``.
    """
    _check_same_shape(x=x, mask=mask, weights=weights)
    mask = mask.bool()
    w = mask.to(x.dtype) if weights is None else torch.where(mask, weights.to(x.dtype), 0.0)
    num = torch.where(mask, x * w, torch.zeros_like(x)).sum()
    den = w.sum() if denominator is None else torch.as_tensor(denominator, dtype=x.dtype, device=x.device)
    return torch.where(den != 0, num / torch.where(den != 0, den, 1.0), torch.zeros_like(num))


def ppo_policy_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.2,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> PolicyLoss:
    """PPO's clipped surrogate with asymmetric clipping (paper Eq. 7; GRPO "clip-higher").

    ``r = exp(log_probs - old_log_probs)``; per entry
    ``loss = max(-A * r, -A * clip(r, 1 - clip_low, 1 + clip_high))``, then ``masked_mean``.
    The PPO OpenVLA recipe uses 0.2 / 0.2, the GRPO and PPO OpenVLA-OFT recipes 0.2 / 0.28.

    Args:
        log_probs: current policy's log-probs (differentiable), at ``logprob_type`` granularity.
        old_log_probs: the rollout policy's log-probs of the same actions.
        advantages: advantages broadcast to the log-probs' shape.
        mask: bool, entries that count.
        clip_low: the ratio is clipped below at ``1 - clip_low``; in [0, 1).
        clip_high: the ratio is clipped above at ``1 + clip_high``; >= 0.
        weights: per-entry weights (``length_normalization_weights`` for GRPO), or None.
        denominator: fixed normaliser (see module docstring), or None.

    Returns:
        ``PolicyLoss(loss, clipfrac, approx_kl, ratio_mean, ratio_min, ratio_max)``; the ratio
        statistics are over valid entries (1 when there are none).

    Raises:
        ValueError: shapes differ, or a clip range outside its bounds.

    Shapes:
        log_probs, old_log_probs, advantages, mask, weights: the same shape, e.g. ``[B]``,
        ``[B, C]`` or ``[B, C, A]`` for a minibatch of ``B`` chunks. Returns scalars.
    """
    if not 0.0 <= clip_low < 1.0:
        raise ValueError(f"clip_low={clip_low!r} must lie in [0, 1)")
    if clip_high < 0.0:
        raise ValueError(f"clip_high={clip_high!r} must be >= 0")
    _check_same_shape(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages,
                      mask=mask, weights=weights)
    mask = mask.bool()
    # masked entries get ratio 1 before exp, so a stale log-prob there cannot overflow or NaN
    log_ratio = torch.where(mask, log_probs - old_log_probs, torch.zeros_like(log_probs))
    ratio = log_ratio.exp()
    pg_loss1 = -advantages * ratio
    pg_loss2 = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    loss = masked_mean(torch.maximum(pg_loss1, pg_loss2), mask, weights, denominator)

    with torch.no_grad():
        # low-variance KL(old || new) estimator: http://joschu.net/blog/kl-approx.html. A token that
        # left the new policy's top-k (sampling_params.top_k) has log-prob -inf, ratio 0 and no
        # gradient; its KL term would be inf, so it counts 0 here (ratio_min shows it as 0). Over the
        # same entries as clipfrac, so micro-batch shares add up to the batch's mean
        approx_kl = masked_mean(torch.where(torch.isfinite(log_ratio), (ratio - 1.0) - log_ratio, 0.0), mask)
        outside = (ratio < 1.0 - clip_low) | (ratio > 1.0 + clip_high)
        clipfrac = masked_mean(outside.to(ratio.dtype), mask)
        ratio_mean = masked_mean(ratio, mask)
        any_valid = mask.any()
        ratio_min = torch.where(any_valid, torch.where(mask, ratio, torch.inf).min(), 1.0)
        ratio_max = torch.where(any_valid, torch.where(mask, ratio, -torch.inf).max(), 1.0)
    return PolicyLoss(loss, clipfrac, approx_kl, ratio_mean, ratio_min.to(ratio.dtype),
                      ratio_max.to(ratio.dtype))


def huber(x: torch.Tensor, delta: float | None = 10.0) -> torch.Tensor:
    """Huber loss of an error: ``0.5 x^2`` for ``|x| <= delta``, ``delta (|x| - delta / 2)`` beyond.

    Args:
        x: errors.
        delta: where the loss turns linear (None: ``0.5 x^2`` everywhere).

    Returns:
        Elementwise loss.

    Shapes:
        x: any. Returns the shape of ``x``.
    """
    if delta is None:
        return 0.5 * x.square()
    if delta <= 0:
        raise ValueError(f"huber delta={delta!r} must be > 0 (or None for the squared error)")
    abs_x = x.abs()
    return torch.where(abs_x <= delta, 0.5 * x.square(), delta * (abs_x - 0.5 * delta))


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip: float | None = 0.2,
    huber_delta: float | None = 10.0,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> ValueLoss:
    """Clipped value loss with a Huber error (RLinf/RL4VLA PPO: clip 0.2, delta 10).

    ``v_clipped = old_values + clip(values - old_values, -clip, clip)``; per entry
    ``loss = max(huber(values - returns), huber(v_clipped - returns))``, then ``masked_mean``.

    Args:
        values: current critic's predictions (differentiable).
        old_values: the critic's predictions at rollout time.
        returns: value targets (``GAEOutput.returns``).
        mask: bool, entries that count.
        clip: how far predictions may move from ``old_values`` before the loss stops rewarding
            it (None: no clipping).
        huber_delta: Huber threshold (None: ``0.5 * squared error``).
        weights: per-entry weights, or None.
        denominator: fixed normaliser, or None.

    Returns:
        ``ValueLoss(loss, clipfrac)``.

    Raises:
        ValueError: shapes differ, ``clip < 0`` or ``huber_delta <= 0``.

    Shapes:
        values, old_values, returns, mask, weights: the same shape (``[B]`` chunk-level,
        ``[B, C]`` action-level). Returns scalars.
    """
    _check_same_shape(values=values, old_values=old_values, returns=returns, mask=mask,
                      weights=weights)
    if clip is not None and clip < 0:
        raise ValueError(f"value clip={clip!r} must be >= 0 (or None)")
    loss = huber(values - returns, huber_delta)
    moved = values - old_values
    if clip is not None:
        v_clipped = old_values + moved.clamp(-clip, clip)
        loss = torch.maximum(loss, huber(v_clipped - returns, huber_delta))
    with torch.no_grad():
        outside = moved.abs() > clip if clip is not None else torch.zeros_like(mask, dtype=torch.bool)
        clipfrac = masked_mean(outside.to(values.dtype), mask)
    return ValueLoss(masked_mean(loss, mask, weights, denominator), clipfrac)


def entropy_bonus(
    entropy: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 0.0,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> Penalty:
    """Entropy bonus: ``loss = -coef * mean entropy`` (0 in every reference recipe).

    Args:
        entropy: per-token entropies (``ActionEvaluation.entropy``), possibly reduced.
        mask: bool, entries that count.
        coef: bonus coefficient (>= 0 rewards entropy).
        weights: per-entry weights, or None.
        denominator: fixed normaliser, or None.

    Returns:
        ``Penalty(loss, value)``: the term to add, and the mean entropy (detached) to log.

    Shapes:
        entropy, mask, weights: the same shape. Returns scalars.
    """
    mean = masked_mean(entropy, mask, weights, denominator)
    return Penalty(-coef * mean, mean.detach())


def k3_kl(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    """Per-sample k3 estimate of KL(p || q) from samples of ``p``: ``r - 1 - log r``, ``r = q / p``.

    Unbiased and always >= 0 (Schulman, "Approximating KL divergence").
    ``k3_kl(old_log_probs, log_probs)`` is PPO's ``approx_kl``;
    ``k3_kl(log_probs, ref_log_probs)`` the KL penalty to a reference policy.

    Args:
        log_p: log-probs of the sampled actions under ``p``.
        log_q: log-probs of the same actions under ``q``.

    Returns:
        Elementwise estimates.

    Shapes:
        log_p, log_q: the same shape. Returns that shape.
    """
    log_r = log_q - log_p
    return log_r.exp() - 1.0 - log_r


def kl_penalty(
    log_probs: torch.Tensor,
    ref_log_probs: torch.Tensor,
    mask: torch.Tensor,
    *,
    coef: float = 0.0,
    weights: torch.Tensor | None = None,
    denominator: float | torch.Tensor | None = None,
) -> Penalty:
    """KL penalty to a frozen reference policy, k3 estimator; off (``coef=0``) by default.

    No reference recipe uses it on VLAs; it is here for LLM-style GRPO (``coef`` ~ 1e-3).
    ``loss = coef * mean(k3_kl(log_probs, ref_log_probs))``.

    Args:
        log_probs: current policy's log-probs (differentiable).
        ref_log_probs: the reference policy's log-probs of the same actions.
        mask: bool, entries that count.
        coef: penalty coefficient (>= 0).
        weights: per-entry weights, or None.
        denominator: fixed normaliser, or None.

    Returns:
        ``Penalty(loss, value)``: the term to add, and the mean KL estimate (detached).

    Shapes:
        log_probs, ref_log_probs, mask, weights: the same shape. Returns scalars.
    """
    _check_same_shape(log_probs=log_probs, ref_log_probs=ref_log_probs, mask=mask)
    mask = mask.bool()
    ref = torch.where(mask, ref_log_probs, log_probs.detach())  # masked entries: KL 0, finite
    mean = masked_mean(k3_kl(log_probs, ref), mask, weights, denominator)
    return Penalty(coef * mean, mean.detach())


def explained_variance(
    values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor | None = None
) -> torch.Tensor:
    """``1 - Var(returns - values) / Var(returns)`` over valid entries (NaN if ``Var(returns) = 0``).

    1 is a perfect critic, 0 no better than a constant, < 0 worse.

    Args:
        values: predicted values.
        returns: value targets.
        mask: bool, entries that count (None: all).

    Returns:
        A detached scalar.

    Shapes:
        values, returns, mask: the same shape. Returns ``[]``.
    """
    with torch.no_grad():
        if mask is None:
            mask = torch.ones_like(values, dtype=torch.bool)
        _check_same_shape(values=values, returns=returns, mask=mask)
        y, y_pred = returns[mask.bool()].double(), values[mask.bool()].double()
        var_y = y.var(unbiased=False)
        return (1.0 - (y - y_pred).var(unbiased=False) / var_y).to(values.dtype)


def actor_should_update(update_step: int, critic_warmup_steps: int = 0) -> bool:
    """Whether the policy is updated at this update: only the critic trains during warm-up.

    Args:
        update_step: 0-based index of the current update (training iteration).
        critic_warmup_steps: number of first updates that train only the value head.

    Returns:
        ``update_step >= critic_warmup_steps``.

    Raises:
        ValueError: a negative argument.

    Shapes:
        None (integers only).
    """
    if update_step < 0 or critic_warmup_steps < 0:
        raise ValueError(
            f"update_step={update_step} and critic_warmup_steps={critic_warmup_steps} must be >= 0"
        )
    return update_step >= critic_warmup_steps
