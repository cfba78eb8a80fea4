"""GRPO for VLAs (paper sections 3.4.2 and 4.2.2): critic-free, group-relative advantages.

Each env's rollout is one trajectory; envs ``[g * G, (g + 1) * G)`` form group ``g`` and start
from the same initial state (``use_fixed_reset_state_ids=True, group_size=G`` on the env).
A trajectory's score is its undiscounted reward up to and including its first done; its
advantage ``(R - mean_group) / (std_group + eps)`` is given to every one of its valid steps.

Trainer recipe (T chunks, N envs, chunk-level here; action-level works on ``[T, N, C]``)::

    dones = terminated | truncated                              # [T, N]
    mask = first_done_mask(dones)                               # valid-action mask  [T, N]
    scores = trajectory_scores(rewards, dones)                  # [N]
    adv = group_advantages(scores, group_size)                  # [N]
    keep = success_rate_filter(scores, group_size)              # [N // G]
    mask &= keep.repeat_interleave(group_size)                  # drop filtered groups
    weights = length_normalization_weights(mask)                # 1 / T_i on valid steps
    step_adv = adv.expand(T, N)                                 # same A for every step

(action level: ``adv[:, None].expand(T, N, C)``); then
``ppo_policy_loss(..., mask=mask, weights=weights)`` is paper Eq. (12). When the log-probs
are finer than the rewards (action- or token-level ratios under chunk-level rewards), compute
the weights on the mask broadcast to the log-probs' granularity, so that every trajectory's
weights sum to 1 there and a chunk cut short by the episode's end weighs less.
"""

from __future__ import annotations

import torch

from .gae import flatten_sub_steps, unflatten_sub_steps


def _flat_time(x: torch.Tensor, name: str) -> torch.Tensor:
    """One time axis: ``[T, N]`` as is, ``[T, N, C]`` as its ``T * C`` sub-steps in order.

    Shapes:
        x: ``[T, N]`` or ``[T, N, C]``. Returns ``[T, N]`` or ``[T * C, N]``.
    """
    if x.dim() == 2:
        return x
    if x.dim() == 3:
        return flatten_sub_steps(x)
    raise ValueError(f"{name} must be [T, N] or [T, N, C], got shape {list(x.shape)}")


def _unflat_time(x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """Inverse of ``_flat_time`` for a tensor that had ``shape``.

    Shapes:
        x: ``[T, N]`` or ``[T * C, N]``. Returns ``shape``.
    """
    return x if len(shape) == 2 else unflatten_sub_steps(x, shape[2])


def _check_groups(num_envs: int, group_size: int) -> None:
    """Raise a ValueError unless ``group_size`` is a positive integer dividing ``num_envs``.

    Shapes:
        None (integers only).
    """
    if not isinstance(group_size, int) or group_size < 1 or num_envs % group_size:
        raise ValueError(
            f"group_size={group_size!r} must be a positive integer dividing the number of "
            f"trajectories ({num_envs})"
        )


def first_done_mask(dones: torch.Tensor) -> torch.Tensor:
    """Valid-action mask: each env's steps up to and including its first done.

    The paper's "valid action mask" (``auto_reset=False, ignore_terminations=False``): steps
    after a trajectory first finished (success) are not optimised. An env that never finishes
    keeps every step.

    Args:
        dones: bool, ``terminated | truncated`` per step.

    Returns:
        Bool mask, True up to and including the first done of each env.

    Shapes:
        dones: ``[T, N]`` or ``[T, N, C]`` (time = ``T * C`` sub-steps in order).
        Returns the shape of ``dones``.
    """
    d = _flat_time(dones, "dones").bool().long()
    dones_before = d.cumsum(dim=0) - d  # dones strictly before each step
    return _unflat_time(dones_before == 0, dones.shape)


def trajectory_scores(rewards: torch.Tensor, dones: torch.Tensor) -> torch.Tensor:
    """Each trajectory's score: the sum of its rewards up to and including its first done.

    Undiscounted (paper Eq. 10: ``R`` is the total reward, not the discounted return).

    Args:
        rewards: per-step rewards.
        dones: bool, ``terminated | truncated`` per step.

    Returns:
        One score per env.

    Shapes:
        rewards, dones: ``[T, N]`` or ``[T, N, C]``. Returns ``[N]``.
    """
    if rewards.shape != dones.shape:
        raise ValueError(
            f"rewards {list(rewards.shape)} and dones {list(dones.shape)} must have the same shape"
        )
    mask = first_done_mask(dones)
    counted = torch.where(mask, rewards, torch.zeros_like(rewards))
    return _flat_time(counted, "rewards").sum(dim=0)


def group_advantages(
    scores: torch.Tensor, group_size: int, *, eps: float = 1e-6, unbiased: bool = True
) -> torch.Tensor:
    """Group-relative advantages ``(R_i - mean_g) / (std_g + eps)`` (paper Eq. 10).

    Env ``i`` is in group ``i // group_size``. A group whose scores are all equal gets
    advantage exactly 0 (``uniform_groups``, equal up to rounding): computed naively, rounding
    in the mean survives the ``eps`` (eight scores of 0.7 would get +0.056 in float32). The
    arithmetic is float64.
    ``std`` is the sample standard deviation (``unbiased=True``, the default, divides by
    ``G - 1``, as ``torch.std`` and the reference implementation) or the population one
    (divides by ``G``); with ``G = 2`` and scores 0 / 1 the sample one gives -/+0.707 and the
    population one -/+1.

    Args:
        scores: one score per trajectory (``trajectory_scores``).
        group_size: trajectories per group ``G``; must divide ``N``.
        eps: added to the standard deviation.
        unbiased: Bessel's correction in the standard deviation (needs ``G >= 2``).

    Returns:
        One advantage per trajectory, in ``scores``' (floating) dtype.

    Raises:
        ValueError: ``scores`` is not 1-D, ``group_size`` does not divide ``N``, or
            ``unbiased`` with ``group_size < 2``.

    Shapes:
        scores: ``[N]``. Returns ``[N]``.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [N], got shape {list(scores.shape)}")
    _check_groups(scores.shape[0], group_size)
    if unbiased and group_size < 2:
        raise ValueError("group_size=1 has no sample standard deviation; use group_size >= 2")
    dtype = scores.dtype if scores.is_floating_point() else torch.float32
    grouped = scores.reshape(-1, group_size).double()
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, unbiased=unbiased)
    adv = (grouped - mean) / (std + eps)
    adv = torch.where(uniform_groups(scores, group_size)[:, None], torch.zeros_like(adv), adv)
    return adv.reshape(-1).to(dtype)


UNIFORM_RTOL = 1e-5
"""Scores closer than this (relative to ``max(1, |score|)``) count as equal: float32 sums of the
same rewards in another order differ by rounding (0.1 + 0.1 + 1.0 != 1.0 + 0.1 + 0.1), and
``(R - mean) / (std + eps)`` would blow such a difference up to a full-size advantage."""


def uniform_groups(scores: torch.Tensor, group_size: int) -> torch.Tensor:
    """Groups whose trajectories all scored the same (up to ``UNIFORM_RTOL``): no learning signal.

    Shapes:
        scores: ``[N]``. Returns bool ``[N // group_size]``.
    """
    _check_groups(scores.shape[0], group_size)
    grouped = scores.reshape(-1, group_size).double()
    spread = grouped.max(dim=1).values - grouped.min(dim=1).values
    scale = grouped.abs().max(dim=1).values.clamp_min(1.0)
    return spread <= UNIFORM_RTOL * scale


def length_normalization_weights(mask: torch.Tensor) -> torch.Tensor:
    """Per-step weights ``1 / T_i`` on each trajectory's valid steps, so all count equally.

    ``T_i`` is the number of True entries of env ``i`` in ``mask`` (all axes but the env axis
    1), so each trajectory's weights sum to 1 whatever the mask's granularity (compute them on
    the mask you pass to the loss). With ``ppo_policy_loss(mask=mask, weights=w)`` the loss is
    ``(1/G) sum_i (1/T_i) sum_t loss_{i,t}`` over the ``G`` trajectories with a valid step
    (paper Eq. 12). Envs with no valid step get weight 0.

    Args:
        mask: bool, valid steps (e.g. ``first_done_mask``, possibly broadcast).

    Returns:
        Float weights, 0 where ``mask`` is False.

    Shapes:
        mask: ``[T, N, ...]``. Returns the shape of ``mask``.
    """
    if mask.dim() < 2:
        raise ValueError(f"mask must be [T, N, ...], got shape {list(mask.shape)}")
    m = mask.bool().float()
    other_axes = [0] + list(range(2, m.dim()))
    lengths = m.sum(dim=other_axes, keepdim=True)
    return torch.where(lengths > 0, m / lengths.clamp_min(1.0), torch.zeros_like(m))


def success_rate_filter(
    scores: torch.Tensor, group_size: int, low: float | None = None, high: float | None = None
) -> torch.Tensor:
    """Keep-mask over groups worth training on (paper 4.2.2, after DAPO's dynamic sampling).

    Without bounds (the default): drop the groups whose trajectories all scored the same, the
    paper's rule ("discards groups in which all trajectories have identical cumulative
    rewards"): under 0/1 rewards, the all-success and all-fail groups. Their advantages are all
    0. With bounds: keep the groups whose mean score lies in ``[low, high]`` (bounds included;
    the reference's form, e.g. LIBERO recipe: reward 5, bounds 0.5 / 4.5). Expand to envs with
    ``keep.repeat_interleave(group_size)``.

    Args:
        scores: one score per trajectory.
        group_size: trajectories per group; must divide ``N``.
        low: smallest mean score kept, or None (with ``high`` None) for the paper's rule.
        high: largest mean score kept, or None.

    Returns:
        Bool, True for groups to train on.

    Raises:
        ValueError: only one bound given, ``low > high``, or ``group_size`` does not divide ``N``.

    Shapes:
        scores: ``[N]``. Returns ``[N // group_size]``.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [N], got shape {list(scores.shape)}")
    _check_groups(scores.shape[0], group_size)
    if low is None and high is None:
        return ~uniform_groups(scores, group_size)
    if low is None or high is None:
        raise ValueError(f"success-rate filter: give both bounds or neither, got low={low} high={high}")
    if low > high:
        raise ValueError(f"success-rate filter bounds low={low} > high={high}")
    mean = scores.double().reshape(-1, group_size).mean(dim=1)
    return (mean >= low) & (mean <= high)
