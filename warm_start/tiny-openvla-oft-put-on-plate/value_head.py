"""The critic: a 3-layer GELU MLP on the language model's hidden state (RLinf-VLA, Sec. 4)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn


class ValueHead(nn.Module):
    """``hidden -> h1 -> h2 -> num_outputs`` with GELU (OpenVLA-7B: 4096 -> 512 -> 128 -> 1).

    ``num_outputs`` is 1 for chunk-level values and ``chunk_size`` for action-level values.
    """

    def __init__(self, in_dim: int, hidden_sizes: Sequence[int], num_outputs: int):
        super().__init__()
        h1, h2 = hidden_sizes
        self.fc1 = nn.Linear(in_dim, h1)
        self.fc2 = nn.Linear(h1, h2)
        self.fc3 = nn.Linear(h2, num_outputs)
        self.act = nn.GELU()

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[N, D]`` -> float32 ``[N, num_outputs]``."""
        x = hidden.to(self.fc1.weight.dtype)  # the LM may run in bf16 while the head does not
        return self.fc3(self.act(self.fc2(self.act(self.fc1(x))))).float()
