"""The expert's privileged scene poses as training targets, and the head that reads them.

Demos recorded by the scripted expert carry ``scene`` poses ``[T, 7 K]`` (per body xyz + wxyz;
the bodies are named in ``index.json`` ``scene_bodies``). They exist only in simulation and only
for training: ``vla-train pretrain-vision`` regresses them from the vision towers' patches, and
``vla-train sft --scene-loss-weight`` from the language model's action slots. The policy never
receives them.

Read top to bottom:

1. ``scene_targets``: poses ``[T, 7 K]`` -> targets ``[T, 5 K]``: per body ``x, y, z, cos 2 yaw,
   sin 2 yaw`` (yaw modulo pi: a gripper and most objects look the same turned half a turn).
2. Two heads, tokens ``[N, L, D]`` -> targets ``[N, 5 K]``, discarded after training:
   ``PatchHead`` flattens the vision patches (a patch's place in the vector says where it is) and
   ``SlotHead`` pools the language model's action slots with one attention query per body.
3. ``scene_errors``: errors in cm and degrees.
"""

from __future__ import annotations

import torch
from torch import nn

class PatchHead(nn.Module):
    """Patches ``[N, P, D]`` -> scene targets ``[N, K]`` (flatten, MLP)."""

    def __init__(self, num_patches: int, dim: int, num_targets: int, hidden: int = 256):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(num_patches * dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, num_targets))

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        return self.net(patches)


class SlotHead(nn.Module):
    """Slot hidden states ``[N, S, D]`` -> scene targets ``[N, K * T]`` for ``K`` bodies of ``T``
    targets each: one attention-pooling query per body, then an MLP. Permuting the slots does not
    change the output."""

    def __init__(self, dim: int, num_bodies: int, targets_per_body: int, hidden: int = 256, heads: int = 4):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(num_bodies, dim) * dim**-0.5)
        self.norm = nn.LayerNorm(dim)
        self.pool = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Flatten(), nn.Linear(num_bodies * dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, num_bodies * targets_per_body))

    def forward(self, slots: torch.Tensor) -> torch.Tensor:
        keys = self.norm(slots)
        queries = self.queries.expand(len(slots), -1, -1)  # [N, K, D]
        pooled, _ = self.pool(queries, keys, keys, need_weights=False)  # [N, K, D]
        return self.mlp(pooled)


def scene_errors(pred: torch.Tensor, target: torch.Tensor, names: list[str]) -> dict[str, float]:
    """Mean absolute error per body: position in cm, yaw in degrees (from the doubled-angle pair).

    Shapes: pred, target ``[M, 5 K]`` in target units (not z-scored).
    """
    out = {}
    for b in range(len(names) // 5):
        p, t = pred[:, 5 * b : 5 * b + 5], target[:, 5 * b : 5 * b + 5]
        body = names[5 * b].split(".")[0]
        out[f"{body}_cm"] = float((p[:, :3] - t[:, :3]).norm(dim=1).mean() * 100)
        dyaw = torch.atan2(p[:, 4], p[:, 3]) - torch.atan2(t[:, 4], t[:, 3])
        out[f"{body}_yaw_deg"] = float(torch.rad2deg(torch.atan2(dyaw.sin(), dyaw.cos()).abs() / 2).mean())
    return out
