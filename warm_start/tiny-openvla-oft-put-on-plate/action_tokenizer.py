"""OpenVLA's action tokenizer and action (un-)normalisation, as pure functions on tensors.

Each of the ``action_dim`` normalised action values in ``[-1, 1]`` becomes one token:

* ``edges = linspace(-1, 1, n_bins)`` (256 edges, so 255 intervals with one centre each);
* ``bin = digitize(clip(a, -1, 1), edges) - 1`` in ``[0, n_bins - 1]`` (``bin == n_bins - 1``
  only for ``a == 1`` exactly);
* ``token = vocab_size - 1 - bin``: the LAST ``n_bins`` ids of the tokenizer's vocabulary,
  which in Llama-2 are rarely used sub-words that OpenVLA repurposed;
* decoding maps a token back to ``bin``, clamps it to the last interval (``n_bins - 2``) and
  returns that interval's centre.

``vocab_size`` is the tokenizer's base vocabulary (32000 for Llama-2), not the language
model's padded embedding table (32064): OpenVLA pads the table to a multiple of 64 after
adding a pad token, and the action ids stay below the pad id.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .errors import InvalidInputError, UnknownUnnormKeyError


@dataclass(frozen=True)
class ActionTokenizer:
    """Maps normalised actions to vocabulary ids and back.

    Attributes:
        vocab_size: size of the tokenizer's base vocabulary; action ids are
            ``[vocab_size - n_bins, vocab_size)``.
        n_bins: number of bin edges on ``[-1, 1]`` (OpenVLA: 256).
    """

    vocab_size: int
    n_bins: int = 256

    def __post_init__(self):
        if self.n_bins < 2 or self.vocab_size < self.n_bins:
            raise InvalidInputError(
                f"ActionTokenizer needs 2 <= n_bins <= vocab_size; got n_bins={self.n_bins}, "
                f"vocab_size={self.vocab_size}"
            )

    @property
    def first_action_id(self) -> int:
        """The smallest action token id (``vocab_size - n_bins``)."""
        return self.vocab_size - self.n_bins

    def edges(self, dtype=torch.float64, device=None) -> torch.Tensor:
        """Bin edges ``[n_bins]`` on ``[-1, 1]``."""
        # numpy's linspace, bit for bit: torch's rounds some edges differently, which moves
        # actions lying exactly on an edge into the neighbouring bin.
        return torch.from_numpy(np.linspace(-1.0, 1.0, self.n_bins)).to(dtype=dtype, device=device)

    def centers(self, dtype=torch.float64, device=None) -> torch.Tensor:
        """Interval centres ``[n_bins - 1]``."""
        e = self.edges(dtype, device)
        return (e[:-1] + e[1:]) / 2

    def actions_to_bins(self, actions: torch.Tensor) -> torch.Tensor:
        """Bin index of each normalised action value.

        Shapes:
            actions: ``[...]`` float, values outside ``[-1, 1]`` are clipped.
            returns: ``[...]`` int64 in ``[0, n_bins - 1]``.
        """
        a = actions.to(torch.float64).clamp(-1.0, 1.0)
        # bucketize(right=True) is numpy's digitize(right=False): edges[i-1] <= a < edges[i].
        return torch.bucketize(a, self.edges(device=a.device), right=True) - 1

    def bins_to_token_ids(self, bins: torch.Tensor) -> torch.Tensor:
        """Shapes: bins ``[...]`` -> token ids ``[...]`` int64."""
        return self.vocab_size - 1 - bins.long()

    def token_ids_to_bins(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Shapes: token ids ``[...]`` -> bins ``[...]`` int64 in ``[0, n_bins - 1]``.

        Raises:
            InvalidInputError: a token id is not an action token.
        """
        token_ids = token_ids.long()
        bad = (token_ids < self.first_action_id) | (token_ids >= self.vocab_size)
        if bool(bad.any()):
            raise InvalidInputError(
                f"action token ids must lie in [{self.first_action_id}, {self.vocab_size}); "
                f"got e.g. {int(token_ids[bad][0])}"
            )
        return self.vocab_size - 1 - token_ids

    def encode(self, actions: torch.Tensor) -> torch.Tensor:
        """Normalised actions ``[...]`` -> action token ids ``[...]``."""
        return self.bins_to_token_ids(self.actions_to_bins(actions))

    def decode(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Action token ids ``[...]`` -> normalised actions ``[...]`` float32 (bin centres)."""
        bins = self.token_ids_to_bins(token_ids).clamp(0, self.n_bins - 2)
        return self.centers(device=token_ids.device)[bins].to(torch.float32)


def resolve_unnorm_key(norm_stats: Mapping[str, object] | None, unnorm_key: str | None) -> str:
    """The key of the action statistics to use.

    Args:
        norm_stats: ``{unnorm_key: {"action": {"q01", "q99", "mask"}}}`` of a checkpoint.
        unnorm_key: the dataset whose statistics to use; may be None when there is one.

    Raises:
        UnknownUnnormKeyError: the key is unknown, or None while several exist.
    """
    keys = sorted(norm_stats or {})
    if not keys:
        raise UnknownUnnormKeyError(
            "this model has no action statistics (config.norm_stats is empty); "
            "set norm_stats in its config before un-normalising actions"
        )
    if unnorm_key is None:
        if len(keys) == 1:
            return keys[0]
        raise UnknownUnnormKeyError(
            f"this model has action statistics for several datasets; pass unnorm_key, one of {keys}"
        )
    if unnorm_key not in keys:
        raise UnknownUnnormKeyError(f"unknown unnorm_key {unnorm_key!r}; available keys: {keys}")
    return unnorm_key


def action_stats_tensors(
    norm_stats: Mapping[str, Mapping[str, Mapping[str, Sequence]]], unnorm_key: str, action_dim: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(q01 [A], q99 [A], mask [A] bool)`` of one dataset; mask defaults to all True."""
    stats = norm_stats[unnorm_key]["action"]
    q01 = torch.as_tensor(stats["q01"], dtype=torch.float32)
    q99 = torch.as_tensor(stats["q99"], dtype=torch.float32)
    mask = torch.as_tensor(stats.get("mask", [True] * len(q01)), dtype=torch.bool)
    if not (q01.shape == q99.shape == mask.shape == (action_dim,)):
        raise UnknownUnnormKeyError(
            f"norm_stats[{unnorm_key!r}]['action'] must hold q01, q99 (and optional mask) of length "
            f"{action_dim}; got {tuple(q01.shape)}, {tuple(q99.shape)}, {tuple(mask.shape)}"
        )
    return q01, q99, mask


def unnormalize_actions(
    actions: torch.Tensor, q01: torch.Tensor, q99: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """OpenVLA's un-normalisation: ``[-1, 1]`` -> ``[q01, q99]`` where ``mask``, identity elsewhere.

    Shapes:
        actions: ``[..., A]``; q01, q99, mask: ``[A]``. Returns ``[..., A]``.
    """
    q01, q99, mask = (t.to(actions.device) for t in (q01, q99, mask))
    scaled = 0.5 * (actions + 1.0) * (q99 - q01) + q01
    return torch.where(mask, scaled, actions)


def gripper_to_contract(actions: torch.Tensor, convention: str) -> torch.Tensor:
    """The envs' gripper command (-1 open, +1 close) in the last dimension of un-normalised model
    actions of ``convention`` (``OpenVLAConfig.action_gripper``); the other dimensions as they are."""
    if convention == "contract":
        return actions
    g = actions[..., -1]
    g = -torch.sign(2.0 * g - 1.0) if convention == "openvla" else -g  # "panda": +1 open
    return torch.cat([actions[..., :-1], g.unsqueeze(-1)], dim=-1)


def gripper_from_contract(actions: torch.Tensor, convention: str) -> torch.Tensor:
    """``gripper_to_contract``'s inverse for training targets: -1 (open) -> 1 and +1 (close) -> 0 under
    ``"openvla"``, the sign flipped under ``"panda"``."""
    if convention == "contract":
        return actions
    g = actions[..., -1]
    g = 0.5 * (1.0 - g) if convention == "openvla" else -g
    return torch.cat([actions[..., :-1], g.unsqueeze(-1)], dim=-1)


def identity_norm_stats(action_dim: int = 7, key: str = "identity") -> dict:
    """Statistics under which un-normalisation is the identity (q01 = -1, q99 = 1)."""
    return {
        key: {
            "action": {
                "q01": [-1.0] * action_dim,
                "q99": [1.0] * action_dim,
                "mask": [True] * (action_dim - 1) + [False],
            }
        }
    }
