"""Named model configurations: the official 7B architecture and tiny CPU variants.

The tiny presets (~12 M parameters, 64 px images, a few layers) use exactly the classes and
code paths of the 7B models; only the sizes differ. They are built from config, with random
weights and the byte-level tokenizer of tokenizer.py, without any download.

    model, tokenizer = build_model("tiny-openvla-oft", value_type="chunk_level")
"""

from __future__ import annotations

import torch

from .action_tokenizer import identity_norm_stats
from .config import (
    DINOV2_LARGE_REG4_224,
    LLAMA2_7B_OPENVLA,
    SIGLIP_SO400M_224,
    OpenVLAConfig,
    OpenVLAOFTConfig,
)
from .errors import ConfigMismatchError
from .oft import OpenVLAOFTForActionPrediction
from .openvla import OpenVLAForActionPrediction
from .tokenizer import build_byte_tokenizer

TINY_IMAGE_SIZE = 64
TINY_N_BINS = 256
TINY_TOKENIZER_VOCAB = 3 + 256 + TINY_N_BINS  # specials + bytes + action tokens (see tokenizer.py)
TINY_PAD_ID = TINY_TOKENIZER_VOCAB  # <pad> right after the base vocabulary, as in OpenVLA


def _pad_to_multiple(n: int, multiple: int = 64) -> int:
    return (n + multiple - 1) // multiple * multiple


def _tiny_fields() -> dict:
    vision = dict(
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=3,
        patch_size=8,
        image_size=TINY_IMAGE_SIZE,
        layer_norm_eps=1e-6,
        hidden_act="gelu",
    )
    return dict(
        vision_config=dict(vision, mlp_ratio=4, num_register_tokens=4, layerscale_value=1e-5),
        fused_vision_config=dict(vision, intermediate_size=768, vision_use_head=True),
        text_config=dict(
            # embedding table = base vocabulary + <pad>, padded to a multiple of 64 like OpenVLA's 32064
            vocab_size=_pad_to_multiple(TINY_TOKENIZER_VOCAB + 1),
            hidden_size=256,
            intermediate_size=1024,
            num_hidden_layers=6,
            num_attention_heads=4,
            num_key_value_heads=4,
            max_position_embeddings=1024,
            rms_norm_eps=1e-5,
            pad_token_id=TINY_PAD_ID,
            bos_token_id=1,
            eos_token_id=2,
            tie_word_embeddings=False,
        ),
        image_size=TINY_IMAGE_SIZE,
        tokenizer_vocab_size=TINY_TOKENIZER_VOCAB,
        n_action_bins=TINY_N_BINS,
        pad_token_id=TINY_PAD_ID,
        bos_token_id=1,
        prompt_end_token_id=None,  # the byte tokenizer already ends "Out: " with the space byte
        norm_stats=identity_norm_stats(),
        value_hidden_sizes=[64, 32],
    )


def _full_fields() -> dict:
    return dict(
        vision_config=dict(DINOV2_LARGE_REG4_224),
        fused_vision_config=dict(SIGLIP_SO400M_224),
        text_config=dict(LLAMA2_7B_OPENVLA),
    )


PRESETS = {
    "openvla-7b": (OpenVLAConfig, OpenVLAForActionPrediction, _full_fields),
    "openvla-oft-7b": (OpenVLAOFTConfig, OpenVLAOFTForActionPrediction, _full_fields),
    "tiny-openvla": (OpenVLAConfig, OpenVLAForActionPrediction, _tiny_fields),
    "tiny-openvla-oft": (OpenVLAOFTConfig, OpenVLAOFTForActionPrediction, _tiny_fields),
}


def _lookup(preset: str):
    if preset not in PRESETS:
        raise ConfigMismatchError(f"unknown preset {preset!r}; available: {sorted(PRESETS)}")
    return PRESETS[preset]


def build_config(preset: str, **overrides) -> OpenVLAConfig:
    """The config of a preset; keyword arguments override its fields (e.g. ``chunk_size=4``,
    ``value_type="action_level"``)."""
    config_cls, _, fields = _lookup(preset)
    return config_cls(**{**fields(), **overrides})


def model_class_for(config: OpenVLAConfig):
    """The model class a config belongs to."""
    return (
        OpenVLAOFTForActionPrediction if isinstance(config, OpenVLAOFTConfig) else OpenVLAForActionPrediction
    )


def build_tokenizer(config: OpenVLAConfig):
    """The byte tokenizer for a tiny config.

    Raises:
        ConfigMismatchError: for full-size configs, whose Llama tokenizer ships with the checkpoint.
    """
    if config.tokenizer_vocab_size != 3 + 256 + config.n_action_bins:
        raise ConfigMismatchError(
            f"tokenizer_vocab_size={config.tokenizer_vocab_size} is not the byte tokenizer's "
            f"{3 + 256 + config.n_action_bins}; load the tokenizer saved with the checkpoint instead"
        )
    return build_byte_tokenizer(config.n_action_bins)


def build_model(preset: str, *, seed: int = 0, **overrides):
    """A randomly initialised model of a preset and its tokenizer (None for full-size presets).

    Returns:
        ``(model, tokenizer)``; the model is in eval mode, float32.
    """
    config = build_config(preset, **overrides)
    _, model_cls, _ = _lookup(preset)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    tokenizer = build_tokenizer(config) if preset.startswith("tiny") else None
    return model, tokenizer
