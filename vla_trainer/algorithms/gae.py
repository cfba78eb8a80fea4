"""Generalized Advantage Estimation over a rollout with auto-reset (Schulman et al., 2015).

The rollout holds several episodes per env: with SAME_STEP auto-reset, the observation after a
step where an episode ended is already the next episode's first one, and the ended episode's
last observation is only in ``info["final_obs"]``. So at such a step ``t``:

* terminated (the task ended, success or failure): no bootstrap; ``V`` after it is 0.
* truncated and not terminated (time limit): bootstrap with ``V(final_obs)``, never with
  ``values[t + 1]``, which belongs to the next episode.
* in both cases the recursion does not carry GAE from ``t + 1`` back into ``t``.

When both flags are set on the same step, the episode terminated: no bootstrap. Folding
truncation into "done" (no bootstrap on time limits, as CleanRL does) or bootstrapping through
terminations (as RLinf's PPO config does) are both biased; this module does neither.

Invalid steps (``valid`` False) are skipped: they are taken out of the time axis, so a valid
step's successor is the env's next *valid* step (or the bootstrap after the rollout). They get
advantage and return 0, and their rewards, flags and values are never read. Under the env
contract an invalid sub-step only follows the sub-step that ended its episode (or a chunk of an
env that stays finished without auto-reset), where the recursion is cut anyway; skipping keeps
the result right for any mask and ignores the next episode's rewards that ``chunk_reset=
"immediate"`` without skipping reports on invalid sub-steps.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class GAEOutput(NamedTuple):
    """Advantages and value targets (``returns = advantages + values``) at valid steps, 0 elsewhere.

    Shapes:
        advantages, returns: the shape of the ``values`` passed in (``[T, N]`` or ``[T, N, C]``).
    """

    advantages: torch.Tensor
    returns: torch.Tensor


def flatten_sub_steps(x: torch.Tensor) -> torch.Tensor:
    """Put a chunked rollout's sub-steps on one time axis, in execution order.

    Sub-step ``j`` of chunk ``t`` becomes time ``t * C + j``.

    Shapes:
        x: ``[T, N, C]``. Returns ``[T * C, N]``.
    """
    num_chunks, num_envs, chunk_size = x.shape
    return x.permute(0, 2, 1).reshape(num_chunks * chunk_size, num_envs)


def unflatten_sub_steps(x: torch.Tensor, chunk_size: int) -> torch.Tensor:
    """Inverse of ``flatten_sub_steps``.

    Shapes:
        x: ``[T * C, N]``. Returns ``[T, N, C]``.
    """
    return x.reshape(-1, chunk_size, x.shape[1]).permute(0, 2, 1)


def _check_shape(name: str, x: torch.Tensor, shape: tuple[int, ...]) -> None:
    """Raise a ValueError naming ``x`` unless it has ``shape``.

    Shapes:
        x: expected ``shape``.
    """
    if tuple(x.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(x.shape)}")


def _check_discounts(gamma: float, lam: float) -> None:
    """Raise a ValueError unless ``gamma`` and ``lam`` lie in [0, 1].

    Shapes:
        None (floats only).
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma={gamma!r} must lie in [0, 1]")
    if not 0.0 <= lam <= 1.0:
        raise ValueError(f"lam={lam!r} must lie in [0, 1]")


@torch.no_grad()
def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    next_value: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    valid: torch.Tensor | None = None,
) -> GAEOutput:
    """GAE(gamma, lambda) over ``T`` steps of ``N`` envs, correct across episode boundaries.

    For a valid step ``t`` whose next valid step is ``t'`` (or the state after the rollout)::

        bootstrap_t = 0                     if terminated[t]
                    = final_values[t]       elif truncated[t]
                    = values[t']            otherwise (next_value after the last step)
        delta_t     = rewards[t] + gamma * bootstrap_t - values[t]
        A_t         = delta_t + gamma * lam * (1 - done_t) * A_t'      (done = terminated | truncated)

    Special cases: ``lam=1`` gives the discounted return (bootstrapped as above) minus
    ``values``; ``lam=0`` gives the one-step TD errors ``delta_t``.

    At chunk level a step is one chunk (``gamma`` discounts per chunk); use
    ``reduce_rewards`` / ``reduce_flags`` to get chunk-level inputs from ``chunk_step``'s
    ``[T, N, C]`` arrays, and ``compute_action_level_gae`` for one step per action.

    Args:
        rewards: reward of each step.
        values: ``V(s_t)``, the critic's value of the observation each step was taken from.
        terminated: the episode ended at this step for good (no bootstrap).
        truncated: the episode hit the time limit at this step (bootstrap with
            ``final_values`` unless also terminated).
        final_values: ``V`` of ``info["final_obs"]`` where an episode ended at step ``t``;
            read only where ``truncated & ~terminated``.
        next_value: ``V`` of the observation after the last step (the rollout's ``next_obs``).
        gamma: discount per step, in [0, 1].
        lam: GAE lambda, in [0, 1].
        valid: bool, which steps are transitions of a running episode (None: all).

    Returns:
        ``GAEOutput(advantages, returns)``, both 0 at invalid steps, in ``values``' dtype.

    Raises:
        ValueError: mismatched shapes, or ``gamma`` / ``lam`` outside [0, 1].

    Shapes:
        rewards, values, terminated, truncated, final_values, valid: ``[T, N]``.
        next_value: ``[N]``. Returns two ``[T, N]`` tensors.

    Example:
        >>> out = compute_gae(torch.tensor([[1.0]]), torch.tensor([[0.5]]),
        ...                   torch.tensor([[True]]), torch.tensor([[False]]),
        ...                   torch.zeros(1, 1), torch.tensor([9.0]), gamma=0.9, lam=0.95)
        >>> out.advantages   # terminated: 1.0 - 0.5, next_value ignored
        tensor([[0.5000]])
    """
    _check_discounts(gamma, lam)
    if values.dim() != 2:
        raise ValueError(f"values must be [T, N], got shape {list(values.shape)}")
    shape = tuple(values.shape)
    num_steps, num_envs = shape
    for name, x in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated),
                    ("final_values", final_values)):
        _check_shape(name, x, shape)
    _check_shape("next_value", next_value, (num_envs,))
    if valid is None:
        valid = torch.ones(shape, dtype=torch.bool, device=values.device)
    _check_shape("valid", valid, shape)

    dtype = values.dtype if values.is_floating_point() else torch.float32
    values = values.to(dtype)
    rewards = rewards.to(dtype)
    terminated, truncated, valid = terminated.bool(), truncated.bool(), valid.bool()
    done = terminated | truncated
    # what follows a step that ended its episode: V(final obs) on a time limit, 0 on termination
    end_value = torch.where(truncated & ~terminated, final_values.to(dtype), torch.zeros_like(values))

    advantages = torch.zeros_like(values)
    next_v = next_value.to(dtype)  # V of each env's next valid state
    carry = torch.zeros_like(next_v)  # A of each env's next valid step
    for t in reversed(range(num_steps)):
        bootstrap = torch.where(done[t], end_value[t], next_v)
        delta = rewards[t] + gamma * bootstrap - values[t]
        adv = delta + gamma * lam * (~done[t]).to(dtype) * carry
        advantages[t] = torch.where(valid[t], adv, torch.zeros_like(adv))
        # an invalid step is skipped: its successor's value and advantage pass over it unchanged
        carry = torch.where(valid[t], adv, carry)
        next_v = torch.where(valid[t], values[t], next_v)
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return GAEOutput(advantages, returns)


def compute_action_level_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    final_values: torch.Tensor,
    next_value: torch.Tensor,
    *,
    gamma: float,
    lam: float,
    valid: torch.Tensor | None = None,
) -> GAEOutput:
    """GAE with one transition per executed action: time is the ``T * C`` sub-steps in order.

    Sub-step ``(t, j)`` is followed by ``(t, j + 1)``, and ``(t, C - 1)`` by ``(t + 1, 0)``;
    ``gamma`` discounts per sub-step. Invalid sub-steps are skipped as in ``compute_gae``:
    they contribute nothing (advantage and return 0, reward and flags ignored) and the
    recursion links each valid sub-step to the env's next valid one, so it is cut only by a
    ``terminated`` / ``truncated`` flag on a valid sub-step, never by the mask.

    ``values[t, :, j]`` is the action-level critic's ``j``-th output on chunk ``t``'s
    observation (estimating the state before sub-step ``j``); a chunk-level critic's one value
    repeated ``C`` times (``align_values``) also works. ``next_value`` and ``final_values``
    estimate the state at the start of a chunk: pass the critic's first output
    (``V(obs)[:, 0]``).

    Args:
        rewards: reward of each sub-step (``chunk_step``'s ``rewards``, stacked).
        values: value of the state before each sub-step.
        terminated: per sub-step.
        truncated: per sub-step.
        final_values: ``V(final_obs)`` where an episode ended; ``[T, N]`` (one final
            observation per env and chunk) is broadcast to every sub-step of the chunk.
        next_value: ``V`` of the observation after the rollout's last chunk.
        gamma: discount per sub-step, in [0, 1].
        lam: GAE lambda, in [0, 1].
        valid: bool, ``chunk_step``'s ``valid`` (None: all).

    Returns:
        ``GAEOutput(advantages, returns)``, ``[T, N, C]``, 0 at invalid sub-steps.

    Raises:
        ValueError: mismatched shapes, or ``gamma`` / ``lam`` outside [0, 1].

    Shapes:
        rewards, values, terminated, truncated, valid: ``[T, N, C]``.
        final_values: ``[T, N, C]`` or ``[T, N]``. next_value: ``[N]``.
        Returns two ``[T, N, C]`` tensors.
    """
    if values.dim() != 3:
        raise ValueError(f"values must be [T, N, C], got shape {list(values.shape)}")
    shape = tuple(values.shape)
    chunk_size = shape[2]
    if tuple(final_values.shape) == shape[:2]:
        final_values = final_values.unsqueeze(-1).expand(shape)
    for name, x in (("rewards", rewards), ("terminated", terminated), ("truncated", truncated),
                    ("final_values", final_values)):
        _check_shape(name, x, shape)
    if valid is not None:
        _check_shape("valid", valid, shape)

    flat = flatten_sub_steps
    out = compute_gae(
        flat(rewards), flat(values), flat(terminated), flat(truncated), flat(final_values),
        next_value, gamma=gamma, lam=lam, valid=None if valid is None else flat(valid),
    )
    return GAEOutput(
        unflatten_sub_steps(out.advantages, chunk_size), unflatten_sub_steps(out.returns, chunk_size)
    )
