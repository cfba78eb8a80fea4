"""Attention masks and position ids for left-padded multimodal sequences, as pure functions.

Sequences are ``[BOS, image patches, (padding), prompt tokens, action slots]``: padding sits in
the middle so that every row's prompt ends at the same column and the action tokens line up
across the batch. Padding keys are masked and position ids count only valid tokens, so a
padded row computes exactly what it would alone.
"""

from __future__ import annotations

import torch


def position_ids_from_mask(valid: torch.Tensor, offset: torch.Tensor | int = 0) -> torch.Tensor:
    """Positions that skip padding.

    Shapes:
        valid: bool ``[N, K]``; offset: ``[N, 1]`` or int (positions already in a cache).
        returns: int64 ``[N, K]``; padding gets the position of the token before it.
    """
    return (valid.long().cumsum(dim=1) - 1).clamp(min=0) + offset


def attention_bias(valid: torch.Tensor, num_bidirectional: int, dtype: torch.dtype) -> torch.Tensor:
    """Additive 4D mask: causal over the first ``K - S`` tokens, bidirectional over the last ``S``.

    The last ``S = num_bidirectional`` tokens (OFT's action slots) attend to every valid token
    and to each other; every other token attends causally. Padding keys are never attended to;
    a padding query attends to itself so that its (unused) softmax stays finite.

    Shapes:
        valid: bool ``[N, K]``. returns: ``[N, 1, K, K]`` with 0 where allowed, dtype's min elsewhere.
    """
    k = valid.shape[1]
    allowed = torch.ones(k, k, dtype=torch.bool, device=valid.device).tril()
    if num_bidirectional:
        allowed[k - num_bidirectional :, k - num_bidirectional :] = True
    allowed = allowed.unsqueeze(0) & valid.unsqueeze(1)
    allowed = allowed | torch.eye(k, dtype=torch.bool, device=valid.device).unsqueeze(0)
    bias = torch.zeros(allowed.shape, dtype=dtype, device=valid.device)
    return bias.masked_fill(~allowed, torch.finfo(dtype).min).unsqueeze(1)


def decode_step_bias(valid: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Additive mask of one new token attending to every valid cached token and itself.

    Shapes:
        valid: bool ``[N, K]`` (the new token last). returns: ``[N, 1, 1, K]``.
    """
    bias = torch.zeros(valid.shape, dtype=dtype, device=valid.device)
    return bias.masked_fill(~valid, torch.finfo(dtype).min)[:, None, None, :]
