"""The action-token distribution: temperature, top-k, sampling, log-probs and entropy.

Rollout and training both go through ``processed_logits`` so that a token's log-prob recorded
at sampling time is the one the training forward recomputes (same temperature, same top-k).
Logits here are already restricted to the action ids (index ``j`` is token
``first_action_id + j``), which is OpenVLA's "logits masked to action tokens".
"""

from __future__ import annotations

import torch

from .errors import InvalidInputError


def check_sampling_args(temperature: float, top_k: int | None, n_bins: int) -> None:
    """Raises InvalidInputError unless ``temperature > 0`` and ``top_k`` is None or in ``[1, n_bins]``."""
    if not temperature > 0:
        raise InvalidInputError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and not 1 <= top_k <= n_bins:
        raise InvalidInputError(f"top_k must be None or in [1, {n_bins}], got {top_k}")


def processed_logits(action_logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """Logits of the sampling distribution: scaled by ``1 / temperature``, outside the top-k -inf.

    Shapes:
        action_logits: ``[..., n_bins]``; returns float32 ``[..., n_bins]``.
    """
    logits = action_logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


def sample_indices(logits: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``softmax(logits)``. Shapes: ``[..., n_bins]`` -> int64 ``[...]``."""
    probs = torch.softmax(logits, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    return torch.multinomial(flat, 1, generator=generator).view(probs.shape[:-1])


def log_prob_and_entropy(logits: torch.Tensor, indices: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``indices`` and entropy under ``softmax(logits)``.

    Shapes:
        logits: ``[..., n_bins]`` (may hold -inf); indices: int64 ``[...]``.
        returns: ``(log_probs [...], entropy [...])`` float32.
    """
    log_p = torch.log_softmax(logits, dim=-1)
    chosen = log_p.gather(-1, indices.unsqueeze(-1)).squeeze(-1)
    p = log_p.exp()
    # 0 * log 0 = 0 for the entries top-k removed (avoids nan from 0 * -inf).
    entropy = -(p * log_p.masked_fill(p == 0, 0.0)).sum(-1)
    return chosen, entropy
