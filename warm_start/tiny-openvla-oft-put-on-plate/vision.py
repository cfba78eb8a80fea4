"""OpenVLA's fused vision backbone and projector, on transformers' own DINOv2 and SigLIP modules.

OpenVLA feeds the same image to two ViTs (DINOv2-L/14 with 4 registers, SigLIP-so400m/14),
takes each one's patch tokens after its SECOND-TO-LAST block (no final norm, no prefix tokens)
and concatenates them channel-wise: ``[N, 256, 1024 + 1152]`` at 224 px. A 3-layer GELU MLP
projects those to the language model's width. The official checkpoint was built with timm;
``official_names.py`` maps its parameter names onto these modules.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import Dinov2WithRegistersModel, SiglipVisionModel

from .config import OpenVLAConfig


def images_to_pixel_values(images: torch.Tensor, image_mean, image_std) -> torch.Tensor:
    """uint8 RGB images to the channel-stacked, per-tower normalised input of the backbone.

    Args:
        images: uint8 ``[N, H, W, 3]``.
        image_mean, image_std: ``[[3], [3]]`` for the DINOv2 and SigLIP towers.

    Shapes:
        returns: float32 ``[N, 6, H, W]`` (channels 0-2 for DINOv2, 3-5 for SigLIP).
    """
    x = images.permute(0, 3, 1, 2).to(torch.float32) / 255.0
    towers = []
    for mean, std in zip(image_mean, image_std, strict=True):
        m = torch.tensor(mean, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        s = torch.tensor(std, dtype=torch.float32, device=x.device).view(1, 3, 1, 1)
        towers.append((x - m) / s)
    return torch.cat(towers, dim=1)


def _num_blocks_to_run(feature_layer: int, num_layers: int) -> int:
    return feature_layer % num_layers + 1


class FusedVisionBackbone(nn.Module):
    """DINOv2 (``featurizer``) + SigLIP (``fused_featurizer``), patch features concatenated.

    Only the blocks up to ``config.vision_feature_layer`` run; the last block, the final norms
    and SigLIP's pooling head exist so that the official weights load one to one.
    """

    def __init__(self, config: OpenVLAConfig):
        super().__init__()
        self.featurizer = Dinov2WithRegistersModel(config.vision_config)
        self.fused_featurizer = SiglipVisionModel(config.fused_vision_config)
        self.num_prefix_tokens = 1 + config.vision_config.num_register_tokens  # CLS + registers
        self.dino_blocks = _num_blocks_to_run(
            config.vision_feature_layer, config.vision_config.num_hidden_layers
        )
        self.siglip_blocks = _num_blocks_to_run(
            config.vision_feature_layer, config.fused_vision_config.num_hidden_layers
        )
        self.embed_dim = config.vision_config.hidden_size + config.fused_vision_config.hidden_size
        self.num_patches = (config.image_size // config.vision_config.patch_size) ** 2

    @torch.no_grad()
    def zero_cls_position(self) -> None:
        """transformers' DINOv2 adds a position embedding to CLS; timm's (OpenVLA's) adds none.

        Zero at initialisation, so random models share the official semantics and map onto the
        official names without loss. Loaded weights (ours or official) overwrite it.
        """
        self.featurizer.embeddings.position_embeddings[:, 0] = 0

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Shapes: pixel_values ``[N, 6, H, W]`` -> patch features ``[N, P, D_dino + D_siglip]``."""
        dino_pixels, siglip_pixels = torch.split(pixel_values, [3, 3], dim=1)

        h = self.featurizer.embeddings(dino_pixels.to(self.featurizer.dtype))
        for block in self.featurizer.encoder.layer[: self.dino_blocks]:
            h = block(h)
        dino = h[:, self.num_prefix_tokens :]

        g = self.fused_featurizer.embeddings(siglip_pixels.to(self.fused_featurizer.dtype))
        for block in self.fused_featurizer.encoder.layers[: self.siglip_blocks]:
            g = block(g, None)
        return torch.cat([dino, g], dim=2)

    def unused_module_names(self) -> list[str]:
        """Submodules whose outputs the forward never reads (excluded from LoRA)."""
        names = [
            f"featurizer.encoder.layer.{i}"
            for i in range(self.dino_blocks, len(self.featurizer.encoder.layer))
        ]
        names += [
            f"fused_featurizer.encoder.layers.{i}"
            for i in range(self.siglip_blocks, len(self.fused_featurizer.encoder.layers))
        ]
        return names + ["fused_featurizer.head"]


class FusedProjector(nn.Module):
    """OpenVLA's projector for fused backbones: ``D_v -> 4 D_v -> D_llm -> D_llm`` with GELU."""

    def __init__(self, vision_dim: int, llm_dim: int):
        super().__init__()
        self.fc1 = nn.Linear(vision_dim, 4 * vision_dim)
        self.fc2 = nn.Linear(4 * vision_dim, llm_dim)
        self.fc3 = nn.Linear(llm_dim, llm_dim)
        self.act = nn.GELU()

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        """Shapes: ``[N, P, D_v]`` -> ``[N, P, D_llm]``."""
        return self.fc3(self.act(self.fc2(self.act(self.fc1(patches)))))


def sincos_patch_code(grid: int, dim: int, amplitude: float) -> torch.Tensor:
    """2-D sine-cosine codes of a ``grid x grid`` patch grid, row-major like the patches.

    Half the channels code the row, half the column, each as sines and cosines at geometric
    frequencies from half a cycle across the grid (monotonic in the place) to a quarter cycle per
    patch. Shapes: returns ``[grid * grid, dim]``.
    """
    if dim % 4:
        raise ValueError(f"the patch code needs a width divisible by 4, got {dim}")
    steps = torch.arange(dim // 4) / max(dim // 4 - 1, 1)
    freqs = torch.pi / grid * (grid / 2) ** steps  # radians per patch
    place = torch.arange(grid, dtype=torch.float32)[:, None] * freqs  # [grid, dim / 4]
    axis = torch.cat([place.sin(), place.cos()], dim=1)  # [grid, dim / 2]
    rows = axis[:, None, :].expand(grid, grid, -1)
    cols = axis[None, :, :].expand(grid, grid, -1)
    return amplitude * torch.cat([rows, cols], dim=2).reshape(grid * grid, dim)
