"""The parameter table of the official ``openvla/openvla-7b`` checkpoint, from its architecture.

Written from the published architecture, independently of our model classes, so that a test
can check that our modules map onto the official names one to one:

* ``vision_backbone.featurizer``: timm ``vit_large_patch14_reg4_dinov2`` at 224 px (embed 1024,
  24 blocks, MLP 4096, 4 register tokens, LayerScale whose ``gamma`` OpenVLA renamed to
  ``scale_factor``, patch-only position embedding ``[1, 256, 1024]``);
* ``vision_backbone.fused_featurizer``: timm ``vit_so400m_patch14_siglip_224`` (embed 1152,
  27 blocks, MLP 4304, no class token, attention-pooling head ``attn_pool``);
* ``projector``: fused GELU MLP ``2176 -> 8704 -> 4096 -> 4096``;
* ``language_model``: Llama-2-7B with the embedding table padded to 32064 rows.

    python -m vla_trainer.models.official_table          # rewrites openvla_7b_params.json
"""

from __future__ import annotations

import json
import math
from pathlib import Path

TABLE_PATH = Path(__file__).with_name("openvla_7b_params.json")


def _timm_vit(prefix: str, dim: int, depth: int, mlp: int, patch: int, grid: int, *, dinov2_reg: int | None):
    p = {
        f"{prefix}.patch_embed.proj.weight": [dim, 3, patch, patch],
        f"{prefix}.patch_embed.proj.bias": [dim],
    }
    p[f"{prefix}.pos_embed"] = [1, grid * grid, dim]
    if dinov2_reg is not None:
        p[f"{prefix}.cls_token"] = [1, 1, dim]
        p[f"{prefix}.reg_token"] = [1, dinov2_reg, dim]
    for i in range(depth):
        b = f"{prefix}.blocks.{i}"
        for norm in ("norm1", "norm2"):
            p[f"{b}.{norm}.weight"] = [dim]
            p[f"{b}.{norm}.bias"] = [dim]
        p[f"{b}.attn.qkv.weight"] = [3 * dim, dim]
        p[f"{b}.attn.qkv.bias"] = [3 * dim]
        p[f"{b}.attn.proj.weight"] = [dim, dim]
        p[f"{b}.attn.proj.bias"] = [dim]
        p[f"{b}.mlp.fc1.weight"] = [mlp, dim]
        p[f"{b}.mlp.fc1.bias"] = [mlp]
        p[f"{b}.mlp.fc2.weight"] = [dim, mlp]
        p[f"{b}.mlp.fc2.bias"] = [dim]
        if dinov2_reg is not None:
            p[f"{b}.ls1.scale_factor"] = [dim]
            p[f"{b}.ls2.scale_factor"] = [dim]
    p[f"{prefix}.norm.weight"] = [dim]
    p[f"{prefix}.norm.bias"] = [dim]
    if dinov2_reg is None:  # SigLIP's "map" global pool: one latent query attending to the patches
        a = f"{prefix}.attn_pool"
        p[f"{a}.latent"] = [1, 1, dim]
        p[f"{a}.q.weight"] = [dim, dim]
        p[f"{a}.q.bias"] = [dim]
        p[f"{a}.kv.weight"] = [2 * dim, dim]
        p[f"{a}.kv.bias"] = [2 * dim]
        p[f"{a}.proj.weight"] = [dim, dim]
        p[f"{a}.proj.bias"] = [dim]
        p[f"{a}.norm.weight"] = [dim]
        p[f"{a}.norm.bias"] = [dim]
        p[f"{a}.mlp.fc1.weight"] = [mlp, dim]
        p[f"{a}.mlp.fc1.bias"] = [mlp]
        p[f"{a}.mlp.fc2.weight"] = [dim, mlp]
        p[f"{a}.mlp.fc2.bias"] = [dim]
    return p


def _llama(prefix: str, vocab: int, dim: int, mlp: int, depth: int):
    p = {f"{prefix}.model.embed_tokens.weight": [vocab, dim]}
    for i in range(depth):
        b = f"{prefix}.model.layers.{i}"
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            p[f"{b}.self_attn.{proj}.weight"] = [dim, dim]
        p[f"{b}.mlp.gate_proj.weight"] = [mlp, dim]
        p[f"{b}.mlp.up_proj.weight"] = [mlp, dim]
        p[f"{b}.mlp.down_proj.weight"] = [dim, mlp]
        p[f"{b}.input_layernorm.weight"] = [dim]
        p[f"{b}.post_attention_layernorm.weight"] = [dim]
    p[f"{prefix}.model.norm.weight"] = [dim]
    p[f"{prefix}.lm_head.weight"] = [vocab, dim]
    return p


def openvla_7b_param_shapes() -> dict[str, list[int]]:
    """Official parameter name -> shape of ``openvla/openvla-7b``."""
    grid = 224 // 14
    shapes = {}
    shapes.update(_timm_vit("vision_backbone.featurizer", 1024, 24, 4096, 14, grid, dinov2_reg=4))
    shapes.update(_timm_vit("vision_backbone.fused_featurizer", 1152, 27, 4304, 14, grid, dinov2_reg=None))
    vision_dim, llm_dim = 1024 + 1152, 4096
    shapes.update(
        {
            "projector.fc1.weight": [4 * vision_dim, vision_dim],
            "projector.fc1.bias": [4 * vision_dim],
            "projector.fc2.weight": [llm_dim, 4 * vision_dim],
            "projector.fc2.bias": [llm_dim],
            "projector.fc3.weight": [llm_dim, llm_dim],
            "projector.fc3.bias": [llm_dim],
        }
    )
    shapes.update(_llama("language_model", 32064, llm_dim, 11008, 32))
    return dict(sorted(shapes.items()))


def load_table(path: Path = TABLE_PATH) -> dict:
    """The checked-in table: ``{"total_parameters": int, "parameters": {name: shape}}``."""
    return json.loads(path.read_text())


def main() -> None:
    shapes = openvla_7b_param_shapes()
    total = sum(math.prod(s) for s in shapes.values())
    # one tensor per line keeps diffs of the table readable
    rows = ",\n".join(f"  {json.dumps(name)}: {json.dumps(shape)}" for name, shape in shapes.items())
    TABLE_PATH.write_text(f'{{\n "total_parameters": {total},\n "parameters": {{\n{rows}\n }}\n}}\n')
    print(f"{len(shapes)} tensors, {total:,} parameters -> {TABLE_PATH.name}")


if __name__ == "__main__":
    main()
