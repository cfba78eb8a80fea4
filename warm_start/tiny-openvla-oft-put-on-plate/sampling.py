"""The action-token distribution: temperature, top-k, sampling, log-probs and entropy.

Rollout and training both go through ``processed_logits`` so that a token's log-prob recorded
at sampling time is the one the training forward recomputes (same temperature, same top-k).
Logits here are already restricted to the action ids (index ``j`` is token
``first_action_id + j``), which is OpenVLA's "logits masked to action tokens".
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .errors import InvalidInputError


def check_sampling_args(temperature: float, top_k: int | None, n_bins: int) -> None:
    """Raises InvalidInputError unless ``temperature > 0`` and ``top_k`` is None or an integer in
    ``[1, n_bins]`` (numpy's too; not a float, not a bool)."""
    if not temperature > 0:
        raise InvalidInputError(f"temperature must be > 0, got {temperature}")
    if top_k is not None and (isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer))
                              or not 1 <= top_k <= n_bins):
        raise InvalidInputError(f"top_k must be None or an integer in [1, {n_bins}], got {top_k!r}")


def processed_logits(action_logits: torch.Tensor, temperature: float, top_k: int | None) -> torch.Tensor:
    """Logits of the sampling distribution: scaled by ``1 / temperature``, outside the top-k -inf.

    Shapes:
        action_logits: ``[..., n_bins]``; returns float32 ``[..., n_bins]``.
    """
    logits = action_logits.float() / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, int(top_k), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    return logits


class EnvGenerators:
    """One random generator per env (the leading dim of a batch).

    An env's draws then depend only on its own generator, never on which other envs share the
    forward pass: a rollout split into pipeline stages or across workers samples exactly the
    actions one big batch would. Seeded per (run seed, rollout key, global env index).
    """

    def __init__(self, generators: Sequence[torch.Generator]):
        self.generators = list(generators)

    @classmethod
    def seeded(cls, seed: int, key: Sequence[int], env_indices: Sequence[int]) -> "EnvGenerators":
        def one(i: int) -> torch.Generator:
            state = np.random.SeedSequence([int(seed), *map(int, key), int(i)]).generate_state(2, np.uint64)[0]
            return torch.Generator().manual_seed(int(state) >> 1)

        return cls([one(i) for i in env_indices])

    def subset(self, rows: Sequence[int]) -> "EnvGenerators":
        """The generators of ``rows`` (positions in this batch); shared, not copied."""
        return EnvGenerators([self.generators[int(r)] for r in rows])

    def gumbel(self, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """Standard Gumbel noise ``[N, *shape[1:]]``, row ``i`` drawn from generator ``i``."""
        if shape[0] != len(self.generators):
            raise ValueError(f"batch of {shape[0]} envs but {len(self.generators)} generators")
        u = torch.stack([torch.rand(shape[1:], generator=g) for g in self.generators]).to(device)
        u = u.clamp_(torch.finfo(u.dtype).tiny, 1.0 - torch.finfo(u.dtype).eps)
        return -torch.log(-torch.log(u))


def sample_indices(logits: torch.Tensor, generator: torch.Generator | EnvGenerators | None = None) -> torch.Tensor:
    """One draw per row of ``softmax(logits)``. Shapes: ``[..., n_bins]`` -> int64 ``[...]``.

    With ``EnvGenerators`` the draw is Gumbel-max (``argmax(logits + G)``, exactly a softmax
    sample; -inf logits stay impossible) with noise from each env's own generator.
    """
    if isinstance(generator, EnvGenerators):
        return (logits.float() + generator.gumbel(logits.shape, logits.device)).argmax(-1)
    probs = torch.softmax(logits, dim=-1)
    flat = probs.reshape(-1, probs.shape[-1])
    if generator is not None and generator.device.type != flat.device.type:
        # a CPU generator (an evaluation's seed) for a policy on a GPU: torch only draws on the generator's device
        return torch.multinomial(flat.to(generator.device), 1, generator=generator).view(probs.shape[:-1]).to(flat.device)
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
