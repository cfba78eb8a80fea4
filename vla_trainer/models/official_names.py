"""Official OpenVLA checkpoints (timm-named vision weights) <-> our modules, and their loader.

The official ``openvla/openvla-7b`` remote code needs transformers 4.40 and timm. We keep our
own classes on transformers' DINOv2 / SigLIP / Llama modules and translate names at load time:

==============================================  ==============================================
official (timm / prismatic)                     ours (transformers modules)
==============================================  ==============================================
featurizer.blocks.i.attn.qkv                    featurizer.encoder.layer.i.attention.{q,k,v}_proj
featurizer.blocks.i.ls1.scale_factor            featurizer.encoder.layer.i.layer_scale1.lambda1
featurizer.pos_embed [1, 256, D] (patches)      featurizer.embeddings.position_embeddings
                                                [1, 257, D]; slot 0 (CLS) -> added to cls_token
fused_featurizer.blocks.i.attn.qkv              fused_featurizer.encoder.layers.i.self_attn.{q,k,v}_proj
fused_featurizer.pos_embed [1, 256, D]          fused_featurizer.embeddings.position_embedding [256, D]
fused_featurizer.attn_pool.{q, kv}              fused_featurizer.head.attention.in_proj (q; k; v)
projector.*, language_model.*                   same names
==============================================  ==============================================

Tensors of ours that the official checkpoint lacks: DINOv2's ``mask_token`` (unused outside
masked pre-training; zeros) and the value head (freshly initialised).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .config import OpenVLAConfig, OpenVLAOFTConfig
from .errors import ConfigMismatchError

DINO = "vision_backbone.featurizer"
SIGLIP = "vision_backbone.fused_featurizer"
OURS_ONLY_PREFIXES = ("value_head.",)
OURS_ONLY_NAMES = (f"{DINO}.embeddings.mask_token",)

# What transformers 4.40 (the official code's version) filled in for text_config fields the
# official config.json leaves out; the checkpoint ran with these, not with Llama-2's own file.
_LLAMA_V4_DEFAULTS = dict(
    vocab_size=32000,
    hidden_size=4096,
    intermediate_size=11008,
    num_hidden_layers=32,
    num_attention_heads=32,
    num_key_value_heads=None,
    hidden_act="silu",
    max_position_embeddings=2048,
    rms_norm_eps=1e-6,
    rope_theta=10000.0,
    attention_bias=False,
    tie_word_embeddings=False,
    bos_token_id=1,
    eos_token_id=2,
)
_SUPPORTED_VISION = "dinosiglip-vit-so-224px"


@dataclass(frozen=True)
class Group:
    """Official tensors <-> our tensors that hold the same numbers.

    ``to_ours(official_tensors) -> our_tensors`` and ``to_official(our_tensors) -> official_tensors``
    are inverse; both take and return tuples in the order of the name tuples.
    """

    official: tuple[str, ...]
    ours: tuple[str, ...]
    to_ours: Callable[..., tuple[torch.Tensor, ...]]
    to_official: Callable[..., tuple[torch.Tensor, ...]]


def _copy(official: str, ours: str) -> Group:
    return Group((official,), (ours,), lambda t: (t,), lambda t: (t,))


def _qkv(official_prefix: str, ours_prefix: str, q: str, k: str, v: str, out: str) -> list[Group]:
    # timm's fused qkv rows are [q; k; v] (reshape to (3, heads, head_dim) puts the 3 outermost)
    groups = []
    for suffix in ("weight", "bias"):
        groups.append(
            Group(
                (f"{official_prefix}.qkv.{suffix}",),
                tuple(f"{ours_prefix}.{n}.{suffix}" for n in (q, k, v)),
                lambda t: tuple(x.contiguous() for x in torch.chunk(t, 3, dim=0)),
                lambda a, b, c: (torch.cat([a, b, c], dim=0),),
            )
        )
        groups.append(_copy(f"{official_prefix}.proj.{suffix}", f"{ours_prefix}.{out}.{suffix}"))
    return groups


def _vision_groups(config: OpenVLAConfig) -> list[Group]:
    g: list[Group] = []
    d_emb, s_emb = f"{DINO}.embeddings", f"{SIGLIP}.embeddings"
    g += [
        _copy(f"{DINO}.reg_token", f"{d_emb}.register_tokens"),
        # transformers keeps a CLS slot in the position table, added to CLS alone before the blocks;
        # timm's DINOv2 adds no position to CLS: the slot (which training moves) folds into the token
        Group(
            (f"{DINO}.cls_token", f"{DINO}.pos_embed"),
            (f"{d_emb}.cls_token", f"{d_emb}.position_embeddings"),
            lambda cls, pos: (cls, torch.cat([pos.new_zeros(1, 1, pos.shape[-1]), pos], dim=1)),
            lambda cls, pos: (cls + pos[:, :1], pos[:, 1:]),
        ),
        _copy(f"{DINO}.patch_embed.proj.weight", f"{d_emb}.patch_embeddings.projection.weight"),
        _copy(f"{DINO}.patch_embed.proj.bias", f"{d_emb}.patch_embeddings.projection.bias"),
        _copy(f"{DINO}.norm.weight", f"{DINO}.layernorm.weight"),
        _copy(f"{DINO}.norm.bias", f"{DINO}.layernorm.bias"),
    ]
    for i in range(config.vision_config.num_hidden_layers):
        o, u = f"{DINO}.blocks.{i}", f"{DINO}.encoder.layer.{i}"
        g += _qkv(f"{o}.attn", f"{u}.attention", "q_proj", "k_proj", "v_proj", "o_proj")
        g += [
            _copy(f"{o}.ls1.scale_factor", f"{u}.layer_scale1.lambda1"),
            _copy(f"{o}.ls2.scale_factor", f"{u}.layer_scale2.lambda1"),
        ]
        for name in ("norm1", "norm2", "mlp.fc1", "mlp.fc2"):
            g += [_copy(f"{o}.{name}.{s}", f"{u}.{name}.{s}") for s in ("weight", "bias")]

    g += [
        _copy(f"{SIGLIP}.patch_embed.proj.weight", f"{s_emb}.patch_embedding.weight"),
        _copy(f"{SIGLIP}.patch_embed.proj.bias", f"{s_emb}.patch_embedding.bias"),
        Group(
            (f"{SIGLIP}.pos_embed",),
            (f"{s_emb}.position_embedding.weight",),
            lambda t: (t[0],),
            lambda t: (t.unsqueeze(0),),
        ),
        _copy(f"{SIGLIP}.norm.weight", f"{SIGLIP}.post_layernorm.weight"),
        _copy(f"{SIGLIP}.norm.bias", f"{SIGLIP}.post_layernorm.bias"),
    ]
    for i in range(config.fused_vision_config.num_hidden_layers):
        o, u = f"{SIGLIP}.blocks.{i}", f"{SIGLIP}.encoder.layers.{i}"
        g += _qkv(f"{o}.attn", f"{u}.self_attn", "q_proj", "k_proj", "v_proj", "out_proj")
        for official, ours in (
            ("norm1", "layer_norm1"),
            ("norm2", "layer_norm2"),
            ("mlp.fc1", "mlp.fc1"),
            ("mlp.fc2", "mlp.fc2"),
        ):
            g += [_copy(f"{o}.{official}.{s}", f"{u}.{ours}.{s}") for s in ("weight", "bias")]

    o, u = f"{SIGLIP}.attn_pool", f"{SIGLIP}.head"
    dim = config.fused_vision_config.hidden_size
    g += [_copy(f"{o}.latent", f"{u}.probe")]
    for s in ("weight", "bias"):
        # nn.MultiheadAttention packs [q; k; v]; timm's pool has q and kv = [k; v]
        g.append(
            Group(
                (f"{o}.q.{s}", f"{o}.kv.{s}"),
                (f"{u}.attention.in_proj_{s}",),
                lambda q, kv: (torch.cat([q, kv], dim=0),),
                lambda t, dim=dim: tuple(x.contiguous() for x in torch.split(t, [dim, 2 * dim], dim=0)),
            )
        )
        g += [
            _copy(f"{o}.proj.{s}", f"{u}.attention.out_proj.{s}"),
            _copy(f"{o}.norm.{s}", f"{u}.layernorm.{s}"),
            _copy(f"{o}.mlp.fc1.{s}", f"{u}.mlp.fc1.{s}"),
            _copy(f"{o}.mlp.fc2.{s}", f"{u}.mlp.fc2.{s}"),
        ]
    return g


def name_groups(config: OpenVLAConfig, our_names) -> list[Group]:
    """Every official tensor of a model with this config, with the ours it maps to.

    ``our_names`` (our state-dict keys) supplies the projector and language-model names,
    which are identical on both sides.
    """
    groups = _vision_groups(config)
    groups += [_copy(n, n) for n in sorted(our_names) if n.startswith(("projector.", "language_model."))]
    return groups


def is_ours_only(name: str) -> bool:
    """True for our tensors that no official checkpoint has (value head, DINOv2 mask token)."""
    return name.startswith(OURS_ONLY_PREFIXES) or name in OURS_ONLY_NAMES


def official_state_dict(model) -> dict[str, torch.Tensor]:
    """Our model's weights under the official names (works on meta tensors: shapes only).

    DINOv2's CLS position slot has no official counterpart: it is added into the CLS token, which
    is what it does in the forward pass, so the official-layout model computes the same.

    Raises:
        ConfigMismatchError: a tensor of ours is neither mapped nor known to be ours-only.
    """
    ours = model.state_dict()
    out, used = {}, set()
    for group in name_groups(model.config, ours.keys()):
        converted = group.to_official(*(ours[n] for n in group.ours))
        out.update(zip(group.official, converted, strict=True))
        used.update(group.ours)
    leftover = sorted(n for n in ours if n not in used and not is_ours_only(n))
    if leftover:
        raise ConfigMismatchError(f"tensors with no official name: {leftover[:5]} ({len(leftover)} in all)")
    return out


def state_dict_from_official(official: dict[str, torch.Tensor], config: OpenVLAConfig, our_names) -> dict:
    """Official tensors -> our state dict (ours-only tensors are not included).

    Raises:
        ConfigMismatchError: official tensors missing, or present but unknown to our mapping.
    """
    groups = name_groups(config, our_names)
    expected = {n for g in groups for n in g.official}
    missing, unknown = sorted(expected - official.keys()), sorted(official.keys() - expected)
    if missing or unknown:
        raise ConfigMismatchError(
            f"checkpoint does not match the architecture of the config: missing {missing[:5]} "
            f"({len(missing)}), unexpected {unknown[:5]} ({len(unknown)})"
        )
    ours = {}
    for group in groups:
        converted = group.to_ours(*(official[n] for n in group.official))
        ours.update(zip(group.ours, converted, strict=True))
    return ours


# --- loading official checkpoints ----------------------------------------------------------
def config_from_official(official: dict, *, oft: bool = False, **overrides) -> OpenVLAConfig:
    """Our config for an official OpenVLA ``config.json`` (model_type ``"openvla"``).

    Args:
        official: the parsed config.json.
        oft: build the OpenVLA-OFT (parallel decoding) config instead of OpenVLA's.
        overrides: fields of ours to set, e.g. ``chunk_size=8``, ``value_type="chunk_level"``.

    Raises:
        ConfigMismatchError: naming the official field we do not support.
    """
    if official.get("model_type") != "openvla":
        raise ConfigMismatchError(
            f"official config field 'model_type' must be 'openvla', got {official.get('model_type')!r}"
        )
    if official.get("vision_backbone_id") != _SUPPORTED_VISION:
        raise ConfigMismatchError(
            f"official config field 'vision_backbone_id' is {official.get('vision_backbone_id')!r}; "
            f"only {_SUPPORTED_VISION!r} (OpenVLA-7B) is supported"
        )
    if not str(official.get("llm_backbone_id", "")).startswith("llama2"):
        raise ConfigMismatchError(
            f"official config field 'llm_backbone_id' is {official.get('llm_backbone_id')!r}; "
            "only Llama-2 is supported"
        )
    sizes = official.get("image_sizes", [224, 224])
    if list(sizes) != [224, 224]:
        raise ConfigMismatchError(f"official config field 'image_sizes' must be [224, 224], got {sizes}")
    text = dict(_LLAMA_V4_DEFAULTS)
    known = set(_LLAMA_V4_DEFAULTS) | {"pad_token_id"}
    text.update({k: v for k, v in official.get("text_config", {}).items() if k in known})
    if text["num_key_value_heads"] is None:
        text["num_key_value_heads"] = text["num_attention_heads"]
    pad_to = official.get("pad_to_multiple_of", 64)
    fields = dict(
        text_config=text,
        # OpenVLA's action ids sit below the vocabulary without its pad-to-multiple rows
        tokenizer_vocab_size=text["vocab_size"] - pad_to,
        n_action_bins=official.get("n_action_bins", 256),
        pad_token_id=official.get("pad_token_id", 32000),
        norm_stats=official.get("norm_stats") or {},
        # OpenVLA's datasets give the gripper in [0, 1], 1 open; the reference's ManiSkill fine-tunes
        # give the Panda's raw command: convert those with action_gripper="panda"
        action_gripper="openvla",
    )
    fields.update(overrides)
    return (OpenVLAOFTConfig if oft else OpenVLAConfig)(**fields)


def resolve_checkpoint_dir(source: str | os.PathLike) -> Path:
    """A local directory as is; anything else is taken as a hub id and downloaded.

    Only a hub id the caller passes ever reaches the network (and with ``HF_HUB_OFFLINE=1``
    only the local cache is used).
    """
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists() or str(source).count("/") != 1:
        raise FileNotFoundError(f"{source!r} is neither a checkpoint directory nor a hub id 'owner/name'")
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(str(source), allow_patterns=["*.json", "*.safetensors", "tokenizer*"]))


def iter_safetensors(directory: Path, dtype: torch.dtype | None) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of every ``*.safetensors`` file of a checkpoint directory."""
    from safetensors import safe_open

    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors files in {directory}")
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():
                t = f.get_tensor(name)
                yield name, (t.to(dtype) if dtype is not None else t)


def load_official_openvla(
    source: str | os.PathLike,
    *,
    oft: bool = False,
    config: OpenVLAConfig | None = None,
    dtype: torch.dtype = torch.bfloat16,
    **overrides,
):
    """Builds our model from an official OpenVLA checkpoint (directory or hub id).

    Args:
        source: a directory with the official ``config.json`` + ``*.safetensors``, or a hub id
            such as ``"openvla/openvla-7b"`` (downloaded only then).
        oft: return ``OpenVLAOFTForActionPrediction`` (parallel decoding) on the same weights.
        config: use this config instead of deriving one from the official config.json.
        dtype: dtype of the weights in memory.
        overrides: config fields, e.g. ``chunk_size=8``, ``value_type="chunk_level"``.

    Returns:
        The model in eval mode. Parameters are assigned straight from the files (the model is
        built on the meta device), so peak memory is about one copy of the weights.
    """
    from accelerate import init_empty_weights

    from .presets import model_class_for
    from .value_head import ValueHead

    directory = resolve_checkpoint_dir(source)
    if config is None:
        official_config = json.loads((directory / "config.json").read_text())
        config = config_from_official(official_config, oft=oft, **overrides)
    model_cls = model_class_for(config)
    with init_empty_weights(include_buffers=False):
        model = model_cls(config)
    names = list(model.state_dict().keys())
    ours = state_dict_from_official(dict(iter_safetensors(directory, dtype)), config, names)
    model.load_state_dict(ours, strict=False, assign=True)

    embeddings = model.vision_backbone.featurizer.embeddings
    embeddings.mask_token = torch.nn.Parameter(torch.zeros(embeddings.mask_token.shape, dtype=dtype))
    if model.value_head is not None:
        model.value_head = ValueHead(
            config.text_config.hidden_size, config.value_hidden_sizes, config.num_value_outputs
        ).to(dtype)
    still_empty = [n for n, p in model.named_parameters() if p.is_meta]
    if still_empty:
        raise ConfigMismatchError(f"parameters not found in the checkpoint: {still_empty[:5]}")
    return model.eval()
