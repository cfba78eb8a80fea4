"""Tiny VLA models and observations shared by the test_models_* files; offline hub."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # before huggingface_hub is imported anywhere

import numpy as np
import torch

from vla_trainer.models import VLAPolicy, build_model

torch.set_num_threads(1)  # 2 shared cores: one thread is faster than two contending ones

INSTRUCTIONS = ("Pick up the red cube", "push it", "Put the carrot on the plate and then wait")


def tiny(preset: str = "tiny-openvla-oft", seed: int = 0, **overrides):
    """(model, tokenizer) of a tiny preset, float32, eval mode."""
    return build_model(preset, seed=seed, **overrides)


def make_obs(n: int = 3, size: int = 64, seed: int = 0) -> dict:
    """An observation dict as vla_envs returns it."""
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        "state": rng.standard_normal((n, 9)).astype(np.float32),
        "instruction": tuple(INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n)),
    }


def policy_for(model, tokenizer, **kw) -> VLAPolicy:
    return VLAPolicy(model, tokenizer, **kw)


def raw_outputs(model, inputs):
    """(action_logits [N, C, A, n_bins], values) of a model (or peft/remote-code model) on inputs."""
    core = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.no_grad():
        out = core(
            inputs.pixel_values,
            inputs.input_ids,
            inputs.attention_mask,
            action_token_ids=_dummy_tokens(core, inputs.input_ids.shape[0]),
        )
    return out.action_logits, out.values


def _dummy_tokens(core, n: int) -> torch.Tensor:
    first = core.config.tokenizer_vocab_size - core.config.n_action_bins
    g = torch.Generator().manual_seed(1)
    return first + torch.randint(
        0, core.config.n_action_bins, (n, core.config.chunk_size, core.config.action_dim), generator=g
    )
