"""Env actions as action-token targets, and their likelihood under a policy: the SFT objective
(``vla-train sft``) and the behaviour-cloning term of an RL update.

The policy decodes tokens to normalised actions in ``[-1, 1]`` and un-normalises them with the
checkpoint's q01/q99 statistics (``a_env = 0.5 (a + 1)(q99 - q01) + q01`` where ``mask``).
Targets apply the inverse (``normalize_actions``), clipped to ``[-1, 1]``, then
the action tokenizer. With the tiny presets' identity statistics (q01 = -1, q99 = 1) the
normalisation is a no-op.
"""

from __future__ import annotations

import numpy as np
import torch

from .action_tokenizer import gripper_from_contract
from .openvla import VLAOutput
from .policy import PolicyInputs, VLAPolicy


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
    actions = gripper_from_contract(torch.as_tensor(action_chunk, dtype=torch.float32), policy.config.action_gripper)
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


def gaussian_bin_targets(target: torch.Tensor, n_bins: int, sigma_bins: float) -> torch.Tensor:
    """A Gaussian over ``n_bins`` bins centred on each target bin, normalised over the bins.

    Shapes: target int64 ``[...]`` -> float32 ``[..., n_bins]``.
    """
    bins = torch.arange(n_bins, device=target.device, dtype=torch.float32)
    return torch.softmax(-0.5 * ((bins - target.unsqueeze(-1).float()) / sigma_bins) ** 2, dim=-1)
