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
    keep = success_rate_filter(scores, group_size, low, high)   # [N // G]
    mask &= keep.repeat_interleave(group_size)                  # drop filtered groups
    weights = length_normalization_weights(mask)                # 1 / T_i on valid steps
    step_adv = adv.expand(T, N)                                 # same A for every step

(action level: ``adv[:, None].expand(T, N, C)``); then
``ppo_policy_loss(..., mask=mask, weights=weights)`` is paper Eq. (12).
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
    advantage 0. ``std`` is the sample standard deviation (``unbiased=True``, divides by
    ``G - 1``, as ``torch.std``) or the population one (divides by ``G``).

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
    grouped = scores.reshape(-1, group_size)
    if not grouped.is_floating_point():
        grouped = grouped.float()
    mean = grouped.mean(dim=1, keepdim=True)
    std = grouped.std(dim=1, keepdim=True, unbiased=unbiased)
    return ((grouped - mean) / (std + eps)).reshape(-1)


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
    scores: torch.Tensor, group_size: int, low: float, high: float
) -> torch.Tensor:
    """Keep-mask over groups whose mean score lies in ``[low, high]`` (bounds included).

    With success reward ``r``, bounds strictly inside ``(0, r)`` drop the groups where every
    trajectory failed or every one succeeded: their advantages are all 0 (DAPO's dynamic
    sampling; LIBERO recipe: reward 5, bounds 0.5 / 4.5). Expand to envs with
    ``keep.repeat_interleave(group_size)``.

    Args:
        scores: one score per trajectory.
        group_size: trajectories per group; must divide ``N``.
        low: smallest mean score kept.
        high: largest mean score kept.

    Returns:
        Bool, True for groups to train on.

    Raises:
        ValueError: ``low > high`` or ``group_size`` does not divide ``N``.

    Shapes:
        scores: ``[N]``. Returns ``[N // group_size]``.
    """
    if scores.dim() != 1:
        raise ValueError(f"scores must be [N], got shape {list(scores.shape)}")
    _check_groups(scores.shape[0], group_size)
    if low > high:
        raise ValueError(f"success-rate filter bounds low={low} > high={high}")
    mean = scores.double().reshape(-1, group_size).mean(dim=1)
    return (mean >= low) & (mean <= high)
