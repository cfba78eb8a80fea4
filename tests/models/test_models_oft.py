"""OpenVLA-OFT's parallel decoding: the 4D mask, bidirectional slots, a causal prompt."""

from __future__ import annotations

import torch
from tiny_vla import make_obs, policy_for, tiny

from vla_trainer.models.masks import attention_bias, position_ids_from_mask


def test_attention_bias_layout():
    valid = torch.tensor([[True, False, True, True, True, True]])  # one padding key at column 1
    allowed = attention_bias(valid, num_bidirectional=2, dtype=torch.float32)[0, 0] == 0
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],  # the padding query sees itself (finite softmax), never read
            [1, 0, 1, 0, 0, 0],
            [1, 0, 1, 1, 0, 0],
            [1, 0, 1, 1, 1, 1],  # slot 0 sees the prompt and slot 1
            [1, 0, 1, 1, 1, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(allowed, expected)
    assert position_ids_from_mask(valid).tolist() == [[0, 0, 1, 2, 3, 4]]


def _setup(seed=0):
    model, tok = tiny("tiny-openvla-oft", seed=seed, value_type="chunk_level")
    inputs = policy_for(model, tok).prepare(make_obs(3, seed=seed))
    return model, inputs


def test_last_slot_input_changes_first_slot_output():
    model, x = _setup()
    n, d = x.input_ids.shape[0], model.config.text_config.hidden_size
    num_slots = model.tokens_per_step
    assert num_slots == 8 * 7
    with torch.no_grad():
        base = model(x.pixel_values, x.input_ids, x.attention_mask, output_hidden_states=True)
        slots = torch.zeros(n, num_slots, d)
        slots[:, -1] = torch.randn(n, d)
        changed = model(
            x.pixel_values, x.input_ids, x.attention_mask, output_hidden_states=True, slot_embeds=slots
        )
    first_slot_delta = (base.action_logits[:, 0, 0] - changed.action_logits[:, 0, 0]).abs().max().item()
    assert first_slot_delta > 1e-4
    # ... while the prompt (causal) does not see the slots at all
    length = base.prefix_length
    torch.testing.assert_close(
        base.hidden_states[:, :length], changed.hidden_states[:, :length], atol=0, rtol=0
    )


def test_prompt_logits_equal_a_causal_run():
    model, x = _setup(seed=1)
    with torch.no_grad():
        oft = model(x.pixel_values, x.input_ids, x.attention_mask, output_hidden_states=True)
        embeds, valid = model.embed_prefix(x.pixel_values, x.input_ids, x.attention_mask)
        # transformers' own causal mask from the 2D padding mask: independent of our 4D mask code
        causal = model.language_model(
            inputs_embeds=embeds, attention_mask=valid.long(), position_ids=position_ids_from_mask(valid)
        )
    length = oft.prefix_length
    assert causal.logits.shape[1] == length
    oft_logits = model.language_model.lm_head(oft.hidden_states[:, :length])
    torch.testing.assert_close(oft_logits[valid], causal.logits[valid], atol=1e-5, rtol=1e-5)


def test_one_forward_decodes_the_whole_chunk():
    model, x = _setup()
    calls = []
    hook = model.language_model.model.register_forward_hook(lambda *a: calls.append(1))
    try:
        sample = model.sample_actions(x.pixel_values, x.input_ids, x.attention_mask)
    finally:
        hook.remove()
    assert len(calls) == 1 and sample.token_ids.shape == (3, 8, 7)


def test_learned_slot_embeddings_are_the_default_slot_inputs_and_train():
    import pytest

    from vla_trainer.models import ConfigMismatchError, build_config

    model, tok = tiny("tiny-openvla-oft", seed=0, slot_embeddings="learned")
    x = policy_for(model, tok).prepare(make_obs(2, seed=0))
    assert tuple(model.action_slots.shape) == (model.tokens_per_step, model.config.text_config.hidden_size)
    out = model(x.pixel_values, x.input_ids, x.attention_mask)
    explicit = model(x.pixel_values, x.input_ids, x.attention_mask,
                     slot_embeds=model.action_slots.detach().expand(2, -1, -1))
    torch.testing.assert_close(out.action_logits, explicit.action_logits, atol=0, rtol=0)
    zeros = model(x.pixel_values, x.input_ids, x.attention_mask,
                  slot_embeds=torch.zeros(2, model.tokens_per_step, model.config.text_config.hidden_size))
    assert (out.action_logits - zeros.action_logits).abs().max() > 1e-4
    out.action_logits.logsumexp(-1).sum().backward()
    assert model.action_slots.grad is not None and model.action_slots.grad.abs().sum() > 0
    assert tiny("tiny-openvla-oft", seed=0, slot_embeddings="zeros")[0].action_slots is None
    with pytest.raises(ConfigMismatchError, match="slot_embeddings"):
        build_config("tiny-openvla-oft", slot_embeddings="random")


def test_patch_position_code_is_added_to_the_patches_and_trains(tmp_path):
    import pytest

    from vla_trainer.models import ConfigMismatchError, build_config, load_pretrained
    from vla_trainer.models.vision import sincos_patch_code

    model, tok = tiny("tiny-openvla-oft", seed=0, patch_positions="sincos")
    grid = model.config.image_size // model.config.vision_config.patch_size
    torch.testing.assert_close(model.patch_positions.detach(),
                               sincos_patch_code(grid, model.config.text_config.hidden_size, 0.25))
    x = policy_for(model, tok).prepare(make_obs(2, seed=0))
    out = model(x.pixel_values, x.input_ids, x.attention_mask)
    with torch.no_grad():
        code = model.patch_positions.clone()
        model.patch_positions.zero_()
        without = model(x.pixel_values, x.input_ids, x.attention_mask)
        model.patch_positions.copy_(code)
    assert (out.action_logits - without.action_logits).abs().max() > 1e-4
    out.action_logits.logsumexp(-1).sum().backward()
    assert model.patch_positions.grad.abs().sum() > 0
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, _ = load_pretrained(tmp_path)
    assert loaded.config.patch_positions == "sincos"
    torch.testing.assert_close(loaded.patch_positions, model.patch_positions, atol=0, rtol=0)
    assert tiny("tiny-openvla-oft", seed=0)[0].patch_positions is None  # the official model has none
    with pytest.raises(ConfigMismatchError, match="patch_positions"):
        build_config("tiny-openvla-oft", patch_positions="learned")


def test_a_model_without_a_place_code_gets_the_new_models_code_and_keeps_its_weights(tmp_path):
    import pytest

    from vla_trainer.models import ConfigMismatchError, load_pretrained

    model, tok = tiny("tiny-openvla-oft", seed=0)
    coded, _ = tiny("tiny-openvla-oft", seed=0, patch_positions="sincos")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = policy_for(model, tok).prepare(make_obs(2, seed=0))
    plain = model(x.pixel_values, x.input_ids, x.attention_mask).action_logits
    model.add_patch_positions()
    assert model.config.patch_positions == "sincos"
    torch.testing.assert_close(model.patch_positions.detach(), coded.patch_positions.detach(), atol=0, rtol=0)
    assert any(p is model.patch_positions for p in model.parameters())  # an optimizer built now trains it
    for k, v in before.items():
        torch.testing.assert_close(model.state_dict()[k], v, atol=0, rtol=0)
    assert (model(x.pixel_values, x.input_ids, x.attention_mask).action_logits - plain).abs().max() > 1e-4
    with pytest.raises(ConfigMismatchError, match="patch_positions"):
        model.add_patch_positions()
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, _ = load_pretrained(tmp_path)
    torch.testing.assert_close(loaded.patch_positions, model.patch_positions, atol=0, rtol=0)


def test_layout_token_reads_all_patches_into_one_token_after_them(tmp_path):
    import pytest

    from vla_trainer.models import ConfigMismatchError, build_config, load_pretrained

    model, tok = tiny("tiny-openvla-oft", seed=0, layout_token="linear")
    plain, _ = tiny("tiny-openvla-oft", seed=0)
    x = policy_for(model, tok).prepare(make_obs(2, seed=0))
    out = model(x.pixel_values, x.input_ids, x.attention_mask)
    assert out.prefix_length == plain(x.pixel_values, x.input_ids, x.attention_mask).prefix_length + 1
    out.action_logits.logsumexp(-1).sum().backward()
    assert model.layout_token.weight.grad.abs().sum() > 0
    # one patch changed anywhere moves the token: it is a map of the whole grid, not a pooled patch
    with torch.no_grad():
        patches = model.projector(model.vision_backbone(x.pixel_values))
        token = model.layout_token(patches.flatten(1))
        moved = patches.clone()
        moved[:, -1] += 1.0
        assert (model.layout_token(moved.flatten(1)) - token).abs().max() > 1e-4
        # it starts at the size of a projected patch, neither drowning nor drowned
        assert 0.1 < token.norm(dim=-1).mean() / patches.norm(dim=-1).mean() < 10
        weight = model.layout_token.weight.clone()
        model.layout_token.weight.zero_()
        without = model(x.pixel_values, x.input_ids, x.attention_mask)
        model.layout_token.weight.copy_(weight)
    assert (out.action_logits - without.action_logits).abs().max() > 1e-4
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, _ = load_pretrained(tmp_path)
    assert loaded.config.layout_token == "linear"
    torch.testing.assert_close(loaded.layout_token.weight, model.layout_token.weight, atol=0, rtol=0)
    assert plain.layout_token is None  # the official model has none
    with pytest.raises(ConfigMismatchError, match="layout_token"):
        build_config("tiny-openvla-oft", layout_token="attention")


def test_a_model_without_a_layout_token_gets_one_and_keeps_its_weights():
    import pytest

    from vla_trainer.models import ConfigMismatchError

    model, tok = tiny("tiny-openvla-oft", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = policy_for(model, tok).prepare(make_obs(2, seed=0))
    plain = model(x.pixel_values, x.input_ids, x.attention_mask)
    model.add_layout_token()
    assert model.config.layout_token == "linear"
    assert any(p is model.layout_token.weight for p in model.parameters())  # an optimizer built now trains it
    for k, v in before.items():
        torch.testing.assert_close(model.state_dict()[k], v, atol=0, rtol=0)
    added = model(x.pixel_values, x.input_ids, x.attention_mask)
    assert added.prefix_length == plain.prefix_length + 1
    with pytest.raises(ConfigMismatchError, match="layout_token"):
        model.add_layout_token()


def test_sincos_patch_code_tells_every_place_apart_and_reads_out_linearly():
    from vla_trainer.models.vision import sincos_patch_code

    code = sincos_patch_code(8, 64, 1.0).double()  # [64 patches, 64]
    dist = torch.cdist(code, code)
    assert dist[~torch.eye(64, dtype=torch.bool)].min() > 0.5  # no two places share a code
    assert dist[0, 1] < dist[0, 3] and dist[0, 8] < dist[0, 24]  # neighbours are nearer than far places
    place = torch.stack([torch.arange(64) // 8, torch.arange(64) % 8], 1).double()  # (row, col)
    features = torch.cat([code, torch.ones(64, 1, dtype=torch.float64)], 1)
    readout = torch.linalg.pinv(features) @ place
    assert (features @ readout - place).abs().max() < 1e-6


def test_proprio_token_reads_the_robot_state_and_survives_save_and_load(tmp_path):
    import pytest

    from vla_trainer.models import ConfigMismatchError, InvalidInputError, load_pretrained

    model, tok = tiny("tiny-openvla-oft", seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    obs = make_obs(2, seed=0)
    plain = model(*_fields(policy_for(model, tok).prepare(obs)))
    stats = {"mean": [0.5] * 9, "std": [2.0] * 9}
    model.add_proprio(stats)
    for k, v in before.items():  # every earlier weight is kept
        torch.testing.assert_close(model.state_dict()[k], v, atol=0, rtol=0)
    assert any(p is model.proprio_projector[0].weight for p in model.parameters())
    policy = policy_for(model, tok)
    x = policy.prepare(obs)
    assert x.proprio.shape == (2, 9)
    out = model(*_fields(x), proprio=x.proprio)
    assert out.prefix_length == plain.prefix_length + 1  # one state token after the patches
    # the state is z-scored with the model's statistics before the projector sees it
    with torch.no_grad():
        token = model.proprio_token(x.proprio, 2)[:, 0]
        expected = model.proprio_projector((x.proprio - 0.5) / 2.0)
    torch.testing.assert_close(token, expected)
    # a different state gives different actions' logits; the same state the same
    moved = {**obs, "state": obs["state"] + 1.0}
    with torch.no_grad():
        again = model(*_fields(x), proprio=x.proprio).action_logits
        other = model(*_fields(x), proprio=policy.prepare(moved).proprio).action_logits
    torch.testing.assert_close(again, out.action_logits.detach())
    assert (other - again).abs().max() > 1e-4
    sample = policy.act(obs, greedy=True)
    ev = policy.evaluate(sample.inputs, sample.action_token_ids)
    torch.testing.assert_close(ev.log_probs, sample.log_probs, atol=1e-5, rtol=1e-5)
    # what is wrong with an observation is named
    with pytest.raises(InvalidInputError, match="obs\\['state'\\]"):
        policy.prepare({k: v for k, v in obs.items() if k != "state"})
    with pytest.raises(InvalidInputError, match="proprio_dim=9"):
        policy.prepare({**obs, "state": obs["state"][:, :7]})
    with pytest.raises(ConfigMismatchError, match="proprio_dim"):
        model.add_proprio(stats)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    loaded, _ = load_pretrained(tmp_path)
    assert loaded.config.proprio_dim == 9 and loaded.config.proprio_stats == stats
    with torch.no_grad():
        torch.testing.assert_close(loaded(*_fields(x), proprio=x.proprio).action_logits, again)


def test_proprio_stats_are_checked():
    import pytest

    from vla_trainer.models import ConfigMismatchError

    model, _ = tiny("tiny-openvla-oft", seed=0)
    with pytest.raises(ConfigMismatchError, match="proprio_stats.std"):
        model.add_proprio({"mean": [0.0, 0.0], "std": [1.0]})
    with pytest.raises(ConfigMismatchError, match="proprio_stats.std"):
        model.add_proprio({"mean": [0.0], "std": [0.0]})
    assert model.config.proprio_dim == 0 and model.proprio_projector is None  # nothing changed


def _fields(x):
    return x.pixel_values, x.input_ids, x.attention_mask
