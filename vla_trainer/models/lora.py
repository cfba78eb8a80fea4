"""LoRA (peft) on OpenVLA / OpenVLA-OFT: apply, save and load adapters, merge them (exporting a merged
model folder is ``vla_trainer.checkpoint.export_merged``).

``apply_lora`` targets every linear layer of the forward pass (vision blocks that run, the
projector, the language model's attention and MLP, and the LM head, whose action-token rows are
the policy's logits), as the reference's LoRA does, with its Gaussian initialisation of A (B = 0);
the vision blocks and SigLIP pooling head that OpenVLA never runs are left out. The value head is
not LoRA-adapted but stays fully trainable (peft ``modules_to_save``) and is saved with the adapter.

An adapter directory also holds ``vla_base_model.json``: a fingerprint of the base model, so
that loading it onto another base model fails with a clear error instead of silently
producing a different policy.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model

from .errors import AdapterMismatchError
from .policy import unwrap

FINGERPRINT_FILE = "vla_base_model.json"
_ARCH_FIELDS = (
    "model_type",
    "image_size",
    "chunk_size",
    "action_dim",
    "tokenizer_vocab_size",
    "n_action_bins",
)
FINGERPRINT_SAMPLES = 64
"""Base weights sampled per fingerprinted module."""
FINGERPRINT_RTOL, FINGERPRINT_ATOL = 8e-3, 1e-6
"""Two bases match when every sample agrees this closely: the same weights loaded in bfloat16 (a
relative rounding of at most 2^-8) pass; weights trained for even a few steps do not."""


def _fingerprint_modules(model) -> list[str]:
    """Modules whose weights every kind of training moves (the embeddings' unused rows and the
    lm_head's non-action rows get no gradient, so they are not among them): the first language
    layer's q_proj and mlp.down_proj, the last one's v_proj, the projector, the patch embedding."""
    last = sum(1 for name, _ in model.named_modules()
               if name.startswith("language_model.model.layers.") and name.count(".") == 3) - 1
    return ["language_model.model.layers.0.self_attn.q_proj", "language_model.model.layers.0.mlp.down_proj",
            f"language_model.model.layers.{last}.self_attn.v_proj", "projector.fc1",
            "vision_backbone.featurizer.embeddings.patch_embeddings.projection"]


def lora_target_modules(model) -> list[str]:
    """Names of the linear layers LoRA adapts by default (see the module docstring)."""
    model = unwrap(model)
    skip = ("value_head",) + tuple(
        f"vision_backbone.{n}" for n in model.vision_backbone.unused_module_names()
    )
    return [
        name
        for name, module in model.named_modules()
        if isinstance(module, torch.nn.Linear)
        and not any(name == s or name.startswith(s + ".") for s in skip)
    ]


def apply_lora(
    model,
    rank: int = 32,
    alpha: float | None = None,
    dropout: float = 0.0,
    target_modules: list[str] | None = None,
) -> PeftModel:
    """Wraps the model with fresh LoRA adapters (B = 0, so outputs are unchanged at first).

    Args:
        rank: LoRA rank (RLinf recipes: 32).
        alpha: scaling numerator; defaults to ``rank`` (scale 1).
        target_modules: module names; defaults to ``lora_target_modules(model)``.

    Returns:
        The peft model: only adapters and the value head require grad.
    """
    modules_to_save = ["value_head"] if getattr(model, "value_head", None) is not None else None
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha if alpha is not None else rank,
        lora_dropout=dropout,
        target_modules=target_modules or lora_target_modules(model),
        modules_to_save=modules_to_save,
        init_lora_weights="gaussian",
    )
    return get_peft_model(model, config)


def base_fingerprint(model) -> dict:
    """Architecture fields and a sparse sample of base weights (LoRA-free) identifying a model."""
    model = unwrap(model)
    weights = {name: _weight_samples(model, name, FINGERPRINT_SAMPLES) for name in _fingerprint_modules(model)}
    return {"architecture": {f: getattr(model.config, f) for f in _ARCH_FIELDS}, "weights": weights}


def _weight_samples(model, name: str, n: int) -> list[float]:
    """``n`` evenly spaced values of module ``name``'s base weight (under a LoRA layer: the frozen
    one), at full precision: a trained weight moves by less than 1e-3."""
    module = model.get_submodule(name)
    flat = getattr(module, "base_layer", module).weight.detach().float().flatten()
    return [float(v) for v in flat[torch.linspace(0, flat.numel() - 1, n).long()]]


def check_fingerprint(expected: dict, model, where: str) -> None:
    """Raises AdapterMismatchError naming the first difference between two base models."""
    actual = base_fingerprint(model)
    for field, value in expected["architecture"].items():
        if actual["architecture"].get(field) != value:
            raise AdapterMismatchError(
                f"{where} was trained on a base model with {field}={value!r}, but this model has "
                f"{field}={actual['architecture'].get(field)!r}; "
                "load it onto the base model it was trained on"
            )
    for name, values in expected["weights"].items():
        # the modules and samples the fingerprint names (an earlier version sampled others)
        found = _weight_samples(unwrap(model), name, len(values))
        if not torch.allclose(torch.tensor(found, dtype=torch.float64),
                              torch.tensor(values, dtype=torch.float64), rtol=FINGERPRINT_RTOL,
                              atol=FINGERPRINT_ATOL):
            raise AdapterMismatchError(
                f"{where} was trained on another base model: the weights of {name} differ; "
                "load it onto the base model it was trained on"
            )


def save_lora(peft_model: PeftModel, directory: str | os.PathLike) -> None:
    """Saves the adapters (+ value head) and the base model's fingerprint."""
    directory = Path(directory)
    peft_model.save_pretrained(directory)
    (directory / FINGERPRINT_FILE).write_text(json.dumps(base_fingerprint(peft_model), indent=1))


def load_lora(model, directory: str | os.PathLike, is_trainable: bool = True) -> PeftModel:
    """Applies saved adapters to ``model`` (a base model without LoRA).

    Raises:
        AdapterMismatchError: the adapter was trained on another base model.
        FileNotFoundError: ``directory`` holds no adapter saved by ``save_lora``.
    """
    directory = Path(directory)
    fingerprint_file = directory / FINGERPRINT_FILE
    if not fingerprint_file.is_file():
        raise FileNotFoundError(f"{directory} has no {FINGERPRINT_FILE}; save adapters with save_lora")
    check_fingerprint(json.loads(fingerprint_file.read_text()), model, f"the LoRA adapter in {directory}")
    return PeftModel.from_pretrained(model, str(directory), is_trainable=is_trainable)


def merge_lora(model, inplace: bool = False):
    """The plain model with adapters folded into its weights (a copy unless ``inplace``)."""
    if not isinstance(model, PeftModel):
        return model if inplace else copy.deepcopy(model)
    return (model if inplace else copy.deepcopy(model)).merge_and_unload()
