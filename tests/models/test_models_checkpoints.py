"""Save -> load -> identical outputs for base, LoRA and merged checkpoints; official-format
weights; config and adapter mismatches. Everything runs offline on checkpoints made here."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file
from tiny_vla import make_obs, policy_for, raw_outputs, tiny

from vla_trainer.checkpoint import export_merged
from vla_trainer.models import (
    AdapterMismatchError,
    ConfigMismatchError,
    OpenVLAForActionPrediction,
    OpenVLAOFTForActionPrediction,
    apply_lora,
    config_from_official,
    load_lora,
    load_official_openvla,
    load_pretrained,
    lora_target_modules,
    official_state_dict,
    save_lora,
)

# peft calls a transformers property that transformers deprecates; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")

CLASSES = {"tiny-openvla": OpenVLAForActionPrediction, "tiny-openvla-oft": OpenVLAOFTForActionPrediction}


def assert_same(a, b, atol=0.0):
    torch.testing.assert_close(a[0], b[0], atol=atol, rtol=0 if atol == 0 else 1e-5)
    torch.testing.assert_close(a[1], b[1], atol=max(atol, 1e-7), rtol=1e-5)


@pytest.fixture(scope="module", params=list(CLASSES))
def saved(request, tmp_path_factory):
    """A tiny model with a value head, saved with its tokenizer."""
    model, tok = tiny(request.param, value_type="chunk_level")
    directory = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(directory)
    tok.save_pretrained(directory)
    inputs = policy_for(model, tok).prepare(make_obs(3))
    return request.param, model, tok, directory, inputs


def _perturbed_lora(model):
    peft_model = apply_lora(model, rank=4)
    with torch.no_grad():  # fresh LoRA is a no-op (B = 0); make it matter
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.05)
            if "modules_to_save" in name:
                p.add_(0.01)
    return peft_model


def test_base_save_load_identical(saved):
    preset, model, _, directory, inputs = saved
    loaded, tokenizer = load_pretrained(directory)
    assert type(loaded) is CLASSES[preset]
    assert_same(raw_outputs(loaded, inputs), raw_outputs(model, inputs))
    assert policy_for(loaded, tokenizer).prepare(make_obs(3)).input_ids.equal(inputs.input_ids)


def test_loading_with_the_other_class_names_model_type(saved):
    preset, _, _, directory, _ = saved
    other = OpenVLAForActionPrediction if preset.endswith("oft") else OpenVLAOFTForActionPrediction
    with pytest.raises(ConfigMismatchError, match="'model_type'"):
        other.from_pretrained(directory)


def test_checkpoint_config_that_does_not_fit_names_the_field(saved, tmp_path):
    preset, model, tok, _, _ = saved
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    if preset == "tiny-openvla":
        config["chunk_size"] = 4  # OpenVLA decodes one action per step
        field = "chunk_size"
    else:
        config["vision_config"]["image_size"] = 96  # disagrees with image_size=64
        field = "vision_config.image_size"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match=field.replace(".", r"\.")):
        CLASSES[preset].from_pretrained(tmp_path)


def test_lora_targets_and_trainable_parameters(saved):
    preset, model, _, _, _ = saved
    targets = lora_target_modules(model)
    assert "language_model.model.layers.0.self_attn.q_proj" in targets
    assert "projector.fc1" in targets
    assert "vision_backbone.featurizer.encoder.layer.0.attention.q_proj" in targets
    assert not [t for t in targets if t.startswith("value_head")]
    assert "language_model.lm_head" in targets  # the action-token logits, as the reference adapts them
    # the last vision blocks and SigLIP's pooling head never run: not adapted
    last = model.config.vision_config.num_hidden_layers - 1
    assert f"vision_backbone.featurizer.encoder.layer.{last}.mlp.fc1" not in targets
    assert not [t for t in targets if ".head." in t]
    peft_model = apply_lora(tiny(preset, value_type="chunk_level")[0], rank=4)
    trainable = [n for n, p in peft_model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n or "value_head.modules_to_save" in n for n in trainable)
    assert any("value_head" in n for n in trainable)


def test_lora_save_load_identical(saved, tmp_path):
    preset, _, _, directory, inputs = saved
    base, _ = load_pretrained(directory)
    base_out = raw_outputs(base, inputs)
    peft_model = _perturbed_lora(base)
    expected = raw_outputs(peft_model, inputs)
    assert (expected[0] - base_out[0]).abs().max() > 1e-3  # the adapters change the policy
    save_lora(peft_model, tmp_path / "adapter")
    fresh, _ = load_pretrained(directory)
    reloaded = load_lora(fresh, tmp_path / "adapter")
    assert_same(raw_outputs(reloaded, inputs), expected)


def test_merged_export_loads_offline_as_plain_hf_checkpoint(saved, tmp_path):
    from transformers import AutoModelForImageTextToText

    preset, _, tok, directory, inputs = saved
    peft_model = _perturbed_lora(load_pretrained(directory)[0])
    expected = raw_outputs(peft_model, inputs)
    out_dir = export_merged(peft_model, tok, tmp_path / "merged")
    assert raw_outputs(peft_model, inputs)[0].equal(expected[0])  # the wrapper is untouched (copy merged)
    merged = AutoModelForImageTextToText.from_pretrained(out_dir, trust_remote_code=True)
    assert type(merged).__name__ == CLASSES[preset].__name__ and type(merged) is not CLASSES[preset]
    assert_same(raw_outputs(merged, inputs), expected, atol=1e-5)
    config = json.loads((out_dir / "config.json").read_text())
    assert config["norm_stats"]["identity"]["action"]["q99"] == [1.0] * 7
    assert (config["tokenizer_vocab_size"], config["n_action_bins"]) == (515, 256)
    assert "AutoModelForImageTextToText" in config["auto_map"]
    assert not [k for k in merged.state_dict() if "lora" in k or "modules_to_save" in k]
    # the remote-code class works behind the policy interface, with the exported tokenizer
    _, tokenizer = load_pretrained(out_dir)
    sample = policy_for(merged, tokenizer).act(make_obs(2), greedy=True)
    assert sample.actions.shape == (2, merged.config.chunk_size, 7)


def test_a_failed_re_export_leaves_the_previous_export_whole(saved, tmp_path):
    """An export fails (here its tokenizer's save; a kill alike) while replacing an earlier one: the
    earlier one still loads, and a folder holding something else is refused, not replaced."""
    preset, _, tok, directory, inputs = saved
    peft_model = _perturbed_lora(load_pretrained(directory)[0])
    out_dir = export_merged(peft_model, tok, tmp_path / "merged")
    before = sorted(p.name for p in out_dir.iterdir())

    class Failing:
        def save_pretrained(self, path):
            (Path(path) / "tokenizer.json").write_text("{")
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        export_merged(peft_model, Failing(), out_dir)
    assert sorted(p.name for p in out_dir.iterdir()) == before
    assert_same(raw_outputs(load_pretrained(out_dir)[0], inputs), raw_outputs(peft_model, inputs), atol=1e-5)
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "todo.txt").write_text("keep")
    with pytest.raises(FileExistsError, match="not a model folder and holds todo.txt"):
        export_merged(peft_model, tok, tmp_path / "notes")


def test_adapter_for_another_base_model_is_rejected(saved, tmp_path):
    preset, _, _, directory, _ = saved
    save_lora(_perturbed_lora(load_pretrained(directory)[0]), tmp_path / "adapter")
    other_weights, _ = tiny(preset, seed=1, value_type="chunk_level")
    with pytest.raises(AdapterMismatchError, match="another base model"):
        load_lora(other_weights, tmp_path / "adapter")
    other_arch, _ = tiny(
        "tiny-openvla" if preset.endswith("oft") else "tiny-openvla-oft", value_type="chunk_level"
    )
    with pytest.raises(AdapterMismatchError, match="model_type="):
        load_lora(other_arch, tmp_path / "adapter")


def test_adapter_for_a_base_a_few_steps_further_is_rejected_and_its_own_base_in_bf16_accepted(saved, tmp_path):
    """The check let an adapter trained on B load onto A when B was A after a few optimizer steps
    (weights ~1e-3 apart passed its tolerance; its samples of the embeddings and lm_head never
    train): every greedy action changed. Now such a base is refused, while the adapter's own base
    loaded in bfloat16 (a relative rounding of up to 2^-8) still fits."""
    _, _, _, directory, _ = saved
    base = load_pretrained(directory)[0]
    further = load_pretrained(directory)[0]
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # 5 Adam-like steps at lr 1e-4: each weight moves by up to 5e-4
        for p in further.parameters():
            p.add_(5e-4 * torch.sign(torch.randn(p.shape, generator=generator)))
    save_lora(_perturbed_lora(further), tmp_path / "adapter")
    with pytest.raises(AdapterMismatchError, match="another base model"):
        load_lora(base, tmp_path / "adapter")
    save_lora(_perturbed_lora(load_pretrained(directory)[0]), tmp_path / "own")
    load_lora(load_pretrained(directory)[0].to(torch.bfloat16), tmp_path / "own")


def test_official_format_weights_load_into_our_classes(saved, tmp_path):
    preset, model, tok, _, inputs = saved
    official = official_state_dict(model)
    # timm's fused qkv is [q; k; v]; SigLIP's pooling head keeps q and kv apart
    q = model.vision_backbone.featurizer.encoder.layer[0].attention.q_proj.weight
    assert official["vision_backbone.featurizer.blocks.0.attn.qkv.weight"][: q.shape[0]].equal(q)
    assert official["vision_backbone.featurizer.pos_embed"].shape[1] == 64  # patches only
    assert "vision_backbone.fused_featurizer.attn_pool.kv.weight" in official
    assert not [k for k in official if k.startswith("value_head")]
    names = sorted(official)  # two shards, like the 3-shard official checkpoint
    for i, part in enumerate((names[: len(names) // 2], names[len(names) // 2 :])):
        save_file(
            {k: official[k].contiguous() for k in part},
            str(tmp_path / f"model-0000{i + 1}-of-00002.safetensors"),
        )
    loaded = load_official_openvla(tmp_path, config=model.config, dtype=torch.float32)
    assert type(loaded) is CLASSES[preset]
    # the value head is new (not in official checkpoints); everything else is identical
    with torch.no_grad():
        loaded.value_head.load_state_dict(model.value_head.state_dict())
    assert_same(raw_outputs(loaded, inputs), raw_outputs(model, inputs))
    # converted once (docs/training.md), it is a folder of ours that the trainer and vla-eval load
    loaded.save_pretrained(tmp_path / "ours")
    tok.save_pretrained(tmp_path / "ours")
    assert_same(raw_outputs(load_pretrained(tmp_path / "ours")[0], inputs), raw_outputs(model, inputs))
    del official[names[0]]
    save_file(
        {k: official[k].contiguous() for k in official}, str(tmp_path / "model-00001-of-00002.safetensors")
    )
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(ConfigMismatchError, match="missing"):
        load_official_openvla(tmp_path, config=model.config)


def test_the_official_layout_keeps_a_trained_cls_position_slot(saved):
    """Training moves DINOv2's CLS position slot, which timm's layout has no place for: it was
    dropped on export. It is folded into the CLS token (added to CLS alone before the blocks), so the
    official-layout copy computes what the model does."""
    import copy

    from vla_trainer.models.official_names import state_dict_from_official

    _, model, _, _, inputs = saved
    model = copy.deepcopy(model)
    with torch.no_grad():  # LayerScale as trained DINOv2 has it (random init: 1e-5, which mutes what CLS does)
        for layer in model.vision_backbone.featurizer.encoder.layer:
            layer.layer_scale1.lambda1.fill_(1.0)
            layer.layer_scale2.lambda1.fill_(1.0)
    trained = copy.deepcopy(model)
    with torch.no_grad():
        slot = trained.vision_backbone.featurizer.embeddings.position_embeddings[:, 0]
        slot.copy_(0.5 * torch.randn(slot.shape, generator=torch.Generator().manual_seed(0)))
    again = copy.deepcopy(model)
    converted = state_dict_from_official(official_state_dict(trained), trained.config, trained.state_dict().keys())
    again.load_state_dict(converted, strict=False)  # ours-only tensors (value head) stay as copied
    assert_same(raw_outputs(again, inputs), raw_outputs(trained, inputs))
    moved = (raw_outputs(model, inputs)[0] - raw_outputs(trained, inputs)[0]).abs().max()
    assert moved > 1e-3, moved  # the slot matters (dropped, it changed these logits)


OFFICIAL_7B_CONFIG = {
    "model_type": "openvla",
    "vision_backbone_id": "dinosiglip-vit-so-224px",
    "llm_backbone_id": "llama2-7b-pure",
    "arch_specifier": "no-align+fused-gelu-mlp",
    "use_fused_vision_backbone": True,
    "image_sizes": [224, 224],
    "timm_model_ids": ["vit_large_patch14_reg4_dinov2.lvd142m", "vit_so400m_patch14_siglip_224"],
    "n_action_bins": 256,
    "pad_token_id": 32000,
    "pad_to_multiple_of": 64,
    "text_config": {
        "model_type": "llama",
        "pad_token_id": 32000,
        "vocab_size": 32064,
        "torch_dtype": "bfloat16",
    },
    "norm_stats": {
        "bridge_orig": {
            "action": {"q01": [-0.03] * 6 + [0.0], "q99": [0.03] * 6 + [1.0], "mask": [True] * 6 + [False]}
        }
    },
}


def test_config_from_official_7b():
    config = config_from_official(OFFICIAL_7B_CONFIG, oft=True, value_type="chunk_level")
    assert type(config).__name__ == "OpenVLAOFTConfig" and config.chunk_size == 8
    assert config.tokenizer_vocab_size == 32000 and config.text_config.vocab_size == 32064
    assert config.text_config.hidden_size == 4096 and config.fused_vision_config.hidden_size == 1152
    assert config.fused_vision_config.hidden_act == "gelu" and config.vision_config.num_register_tokens == 4
    assert config.norm_stats["bridge_orig"]["action"]["mask"][-1] is False
    assert config.prompt_end_token_id == 29871
    assert config.action_gripper == "openvla"  # its datasets' gripper: [0, 1], 1 open
    assert config_from_official(OFFICIAL_7B_CONFIG, action_gripper="panda").action_gripper == "panda"
    with pytest.raises(ConfigMismatchError, match="'vision_backbone_id'"):
        config_from_official({**OFFICIAL_7B_CONFIG, "vision_backbone_id": "siglip-vit-so400m"})


def test_hub_ids_fail_fast_offline(monkeypatch):
    import huggingface_hub

    # another test module may have imported huggingface_hub before HF_HUB_OFFLINE was set
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    start = time.monotonic()
    with pytest.raises(Exception) as info:
        load_official_openvla("openvla/openvla-7b")
    assert time.monotonic() - start < 10
    assert not isinstance(info.value, (ConfigMismatchError, AttributeError, TypeError))
    with pytest.raises(FileNotFoundError, match="neither a checkpoint directory"):
        load_official_openvla("/nonexistent/dir/x")


def test_half_precision_publication_loads_as_float32_within_rounding(saved, tmp_path):
    from vla_trainer.checkpoint import publish_half_precision

    _, model, _, directory, inputs = saved
    out = publish_half_precision(directory, tmp_path / "shipped", {"command": "test"})
    assert (out / "model.safetensors").stat().st_size < 0.55 * (directory / "model.safetensors").stat().st_size
    assert json.loads((out / "made_by.json").read_text()) == {"command": "test"}
    loaded, tokenizer = load_pretrained(out)
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values()):
        if a.is_floating_point():
            torch.testing.assert_close(b, a.half().float(), rtol=0, atol=0, msg=name)
    logits, values = raw_outputs(loaded, inputs)
    torch.testing.assert_close(logits, raw_outputs(model, inputs)[0], atol=0.05, rtol=0.05)
    with pytest.raises(FileNotFoundError, match="not a model checkpoint folder"):
        publish_half_precision(tmp_path, tmp_path / "x", {})
    assert not (tmp_path / "x").exists()
