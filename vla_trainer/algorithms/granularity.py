"""Granularity of rewards, advantages, values and log-probs for action chunks (paper section 4.1).

Three levels, coarse to fine:

    chunk_level   one transition / value / log-prob per chunk          [T, N]
    action_level  one per executed action (in-chunk sub-step)          [T, N, C]
    token_level   one log-prob per action token (log-probs only)       [T, N, C, A]

``reward_type`` fixes the advantage's granularity (rewards are summed over a chunk or kept per
action); ``logprob_type`` fixes the ratio's; ``value_type`` the critic's. Supported
combinations (paper Table 1, plus the rule for values):

    advantage \\ log-prob   chunk   action   token
    chunk_level              yes     yes      yes    (advantage broadcast to the finer log-prob)
    action_level             no      yes      yes

* An advantage must be no finer than the log-prob it multiplies: a chunk-level log-prob gives
  one ratio per chunk, and ``C`` different action-level advantages cannot be assigned to it.
* A value must be no finer than the advantage it is a baseline for: an action-level critic
  (``C`` values per chunk) has no per-action transitions to estimate under chunk-level rewards.
  A chunk-level critic under action-level rewards is allowed: its one value ``V(o_t)`` is used
  for every sub-step of chunk ``t`` (see ``align_values``).
"""

from __future__ import annotations

import torch

REWARD_TYPES = ("chunk_level", "action_level")
VALUE_TYPES = ("chunk_level", "action_level")
LOGPROB_TYPES = ("chunk_level", "action_level", "token_level")
_FINENESS = {"chunk_level": 0, "action_level": 1, "token_level": 2}


def _check_choice(name: str, value: object, allowed: tuple[str, ...]) -> None:
    """Raise a ValueError listing ``allowed`` unless ``value`` is one of them.

    Shapes:
        None (strings only).
    """
    if value not in allowed:
        raise ValueError(f"{name}={value!r}; allowed: {', '.join(map(repr, allowed))}")


def validate_granularity(
    reward_type: str, logprob_type: str, value_type: str | None = None
) -> str:
    """Check a (reward_type, logprob_type, value_type) combination against paper Table 1.

    Args:
        reward_type: ``"chunk_level"`` or ``"action_level"``; the advantage's granularity.
        logprob_type: ``"chunk_level"``, ``"action_level"`` or ``"token_level"``.
        value_type: ``"chunk_level"``, ``"action_level"`` or None (= ``reward_type``).

    Returns:
        The value type in force (``value_type``, or ``reward_type`` when None).

    Raises:
        ValueError: an unknown name, an advantage finer than the log-prob (action-level
            advantage with chunk-level log-prob), or a value finer than the advantage
            (action-level value with chunk-level reward). The message names the rule.

    Shapes:
        None (strings only).

    Example:
        >>> validate_granularity("chunk_level", "token_level")
        'chunk_level'
    """
    _check_choice("reward_type", reward_type, REWARD_TYPES)
    _check_choice("logprob_type", logprob_type, LOGPROB_TYPES)
    if value_type is None:
        value_type = reward_type
    _check_choice("value_type", value_type, VALUE_TYPES)
    if _FINENESS[reward_type] > _FINENESS[logprob_type]:
        raise ValueError(
            f"reward_type={reward_type!r} with logprob_type={logprob_type!r} is unsupported "
            "(paper Table 1): the advantage must be no finer than the log-prob; a chunk-level "
            "log-prob has one ratio per chunk and cannot carry one advantage per action. Use "
            "logprob_type='action_level' or 'token_level', or reward_type='chunk_level'."
        )
    if _FINENESS[value_type] > _FINENESS[reward_type]:
        raise ValueError(
            f"value_type={value_type!r} with reward_type={reward_type!r} is unsupported: the "
            "value must be no finer than the advantage it estimates; chunk-level rewards have "
            "one transition per chunk, so there is nothing for per-action values to estimate. "
            "Use value_type='chunk_level' (or leave it None to follow reward_type)."
        )
    return value_type


def _check_sub_step_shape(name: str, x: torch.Tensor, valid: torch.Tensor | None) -> None:
    """Raise a ValueError unless ``x`` is ``[T, N, C]`` and ``valid`` (if given) matches it.

    Shapes:
        x, valid: ``[T, N, C]``.
    """
    if x.dim() != 3:
        raise ValueError(f"{name} must be [T, N, C], got shape {list(x.shape)}")
    if valid is not None and valid.shape != x.shape:
        raise ValueError(
            f"valid must have the shape of {name} {list(x.shape)}, got {list(valid.shape)}"
        )


def reduce_rewards(
    rewards: torch.Tensor, reward_type: str, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sub-step rewards at the advantage's granularity.

    ``chunk_level`` sums the rewards of a chunk's valid sub-steps (undiscounted, paper 4.1.1:
    ``r_t = sum_j r_{t,j}``); ``action_level`` keeps them per sub-step. Invalid sub-steps count 0
    in both (under ``chunk_reset="immediate"`` without skipping they carry the next episode's
    rewards, which belong to no transition of the chunk's episode).

    Args:
        rewards: rewards of every sub-step.
        reward_type: ``"chunk_level"`` or ``"action_level"``.
        valid: which sub-steps belong to the episode the chunk was planned for (None: all).

    Returns:
        The rewards at ``reward_type`` granularity, in the dtype of ``rewards``.

    Shapes:
        rewards, valid: ``[T, N, C]``. Returns ``[T, N]`` (chunk_level) or ``[T, N, C]``.
    """
    _check_choice("reward_type", reward_type, REWARD_TYPES)
    _check_sub_step_shape("rewards", rewards, valid)
    if valid is not None:
        rewards = torch.where(valid.bool(), rewards, torch.zeros_like(rewards))
    return rewards.sum(dim=-1) if reward_type == "chunk_level" else rewards


def reduce_flags(
    flags: torch.Tensor, reward_type: str, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sub-step bool flags (``terminated``, ``truncated``, ``valid``) at the advantage's granularity.

    ``chunk_level``: a chunk is flagged when any of its valid sub-steps is (the episode ended
    inside the chunk). ``action_level``: the flags of valid sub-steps, False elsewhere.
    ``reduce_flags(valid, "chunk_level")`` gives the chunk validity mask (the chunk started in a
    running episode).

    Args:
        flags: bool flags of every sub-step.
        reward_type: ``"chunk_level"`` or ``"action_level"``.
        valid: which sub-steps count (None: all).

    Returns:
        Bool flags at ``reward_type`` granularity.

    Shapes:
        flags, valid: ``[T, N, C]``. Returns ``[T, N]`` (chunk_level) or ``[T, N, C]``.
    """
    _check_choice("reward_type", reward_type, REWARD_TYPES)
    _check_sub_step_shape("flags", flags, valid)
    flags = flags.bool()
    if valid is not None:
        flags = flags & valid.bool()
    return flags.any(dim=-1) if reward_type == "chunk_level" else flags


def reduce_log_probs(
    log_probs: torch.Tensor, logprob_type: str, valid: torch.Tensor | None = None
) -> torch.Tensor:
    """Sum per-token log-probs into the requested granularity (paper 4.1.2).

    ``token_level`` keeps them, ``action_level`` sums the ``A`` tokens of an action,
    ``chunk_level`` sums the ``C x A`` tokens of a chunk. With ``valid``, tokens of invalid
    sub-steps count 0: those actions were never executed in the chunk's episode, so they are
    left out of the chunk's probability (and out of the loss mask at finer levels).

    Args:
        log_probs: per-token log-probs, as ``VLAPolicy.act`` / ``evaluate`` return them.
        logprob_type: ``"chunk_level"``, ``"action_level"`` or ``"token_level"``.
        valid: bool, which sub-steps count (None: all).

    Returns:
        Log-probs at ``logprob_type`` granularity.

    Shapes:
        log_probs: ``[..., C, A]``; valid: ``[..., C]``. Returns ``[...]`` (chunk_level),
        ``[..., C]`` (action_level) or ``[..., C, A]`` (token_level).
    """
    _check_choice("logprob_type", logprob_type, LOGPROB_TYPES)
    if log_probs.dim() < 2:
        raise ValueError(f"log_probs must be [..., C, A], got shape {list(log_probs.shape)}")
    if valid is not None:
        if valid.shape != log_probs.shape[:-1]:
            raise ValueError(
                f"valid must be {list(log_probs.shape[:-1])} (log_probs without the token axis), "
                f"got {list(valid.shape)}"
            )
        log_probs = torch.where(valid.bool().unsqueeze(-1), log_probs, torch.zeros_like(log_probs))
    if logprob_type == "token_level":
        return log_probs
    if logprob_type == "action_level":
        return log_probs.sum(dim=-1)
    return log_probs.sum(dim=(-2, -1))


def align_values(values: torch.Tensor, reward_type: str, chunk_size: int) -> torch.Tensor:
    """Critic outputs ``[..., V]`` as the baseline for ``reward_type`` advantages.

    ``V = 1`` (chunk-level critic): ``[...]`` for chunk-level rewards; for action-level rewards
    the one value ``V(o_t)`` is repeated for every sub-step of the chunk (a coarser baseline).
    ``V = C`` (action-level critic): ``[..., C]`` for action-level rewards; with chunk-level
    rewards it is unsupported (see ``validate_granularity``).

    Args:
        values: stacked critic outputs (``ActionSample.values`` is ``[N, V]``).
        reward_type: ``"chunk_level"`` or ``"action_level"``.
        chunk_size: ``C``.

    Returns:
        The values at ``reward_type`` granularity.

    Raises:
        ValueError: ``V`` is neither 1 nor ``chunk_size``, or an action-level critic is paired
            with chunk-level rewards.

    Shapes:
        values: ``[..., V]`` with ``V`` in ``{1, C}``. Returns ``[...]`` (chunk_level) or
        ``[..., C]`` (action_level).
    """
    _check_choice("reward_type", reward_type, REWARD_TYPES)
    width = values.shape[-1] if values.dim() else None
    if width not in (1, chunk_size):
        raise ValueError(
            f"values must be [..., 1] (chunk_level) or [..., {chunk_size}] (action_level), "
            f"got shape {list(values.shape)}"
        )
    if width == 1:
        if reward_type == "chunk_level":
            return values[..., 0]
        return values.expand(*values.shape[:-1], chunk_size)
    if reward_type == "chunk_level":
        raise ValueError(
            f"action-level values [..., {chunk_size}] with reward_type='chunk_level' are "
            "unsupported: the value must be no finer than the advantage it estimates"
        )
    return values


def logprob_valid_mask(valid: torch.Tensor, logprob_type: str, num_tokens: int) -> torch.Tensor:
    """Which log-prob entries belong to executed actions of the chunk's episode.

    A chunk-level log-prob counts when any sub-step of its chunk is valid; an action-level one
    when its sub-step is; a token-level one when its action's sub-step is.

    Args:
        valid: bool, ``chunk_step``'s ``valid``.
        logprob_type: ``"chunk_level"``, ``"action_level"`` or ``"token_level"``.
        num_tokens: tokens per action ``A``.

    Shapes:
        valid: ``[..., C]``. Returns ``[...]``, ``[..., C]`` or ``[..., C, A]``.
    """
    _check_choice("logprob_type", logprob_type, LOGPROB_TYPES)
    valid = valid.bool()
    if logprob_type == "chunk_level":
        return valid.any(dim=-1)
    if logprob_type == "action_level":
        return valid
    return valid[..., None].expand(*valid.shape, num_tokens)


def broadcast_advantages(advantages: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """Expand coarser advantages to the log-probs' shape (paper 4.1.3 "broadcasting").

    A chunk-level advantage ``[T, N]`` is given to every action ``[T, N, C]`` or token
    ``[T, N, C, A]`` of its chunk; an action-level one ``[T, N, C]`` to every token of its
    action. The same call broadcasts a loss mask or per-step weights.

    Args:
        advantages: advantages (or a mask / weights) whose shape is a prefix of ``log_probs``'.
        log_probs: the reduced log-probs the ratio is taken of (only the shape is used).

    Returns:
        A view of ``advantages`` expanded to ``log_probs.shape``.

    Raises:
        ValueError: the advantage is finer than the log-prob or the leading axes differ.

    Shapes:
        advantages: ``[T, N]`` or ``[T, N, C]``; log_probs: ``[T, N]``, ``[T, N, C]`` or
        ``[T, N, C, A]`` (any leading axes work: ``[B]`` vs ``[B, C, A]`` for a flat batch).
        Returns ``log_probs.shape``.
    """
    shape = tuple(log_probs.shape)
    if advantages.dim() > len(shape) or tuple(advantages.shape) != shape[: advantages.dim()]:
        raise ValueError(
            f"advantages {list(advantages.shape)} cannot be broadcast to log_probs {list(shape)}: "
            "the advantage must be no finer than the log-prob (paper Table 1) and share its "
            "leading axes"
        )
    extra = len(shape) - advantages.dim()
    return advantages.reshape(tuple(advantages.shape) + (1,) * extra).expand(shape)
