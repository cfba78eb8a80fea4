"""The policy interface: shapes, log-probs at rollout == log-probs recomputed in training,
padding invariance, greedy mode, value heads and parameter groups."""

from __future__ import annotations

import pytest
import torch
from tiny_vla import INSTRUCTIONS, make_obs, policy_for, tiny

from vla_trainer.models import PolicyInputs, build_config, tokenize_prompts

PRESETS = ["tiny-openvla", "tiny-openvla-oft"]


@pytest.fixture(scope="module", params=PRESETS)
def policy(request):
    model, tok = tiny(request.param, value_type="chunk_level")
    return policy_for(model, tok)


def test_act_shapes_and_action_range(policy):
    sample = policy.act(make_obs(4), generator=torch.Generator().manual_seed(0))
    c = policy.chunk_size
    assert c == (8 if policy.core.config.model_type.endswith("oft") else 1)
    assert sample.actions.shape == sample.action_token_ids.shape == sample.log_probs.shape == (4, c, 7)
    assert sample.actions.dtype == torch.float32 and sample.values.shape == (4, 1)
    assert sample.actions.abs().max() <= 1.0
    first = policy.core.action_tokenizer.first_action_id
    assert ((sample.action_token_ids >= first) & (sample.action_token_ids < first + 256)).all()
    assert (sample.log_probs <= 0).all()
    # the env actions are exactly the decoded bin centres of the sampled tokens (identity stats)
    torch.testing.assert_close(sample.actions, policy.core.action_tokenizer.decode(sample.action_token_ids))


@pytest.mark.parametrize("temperature,top_k", [(1.0, None), (0.6, 50), (1.6, 5)])
def test_rollout_log_probs_equal_training_recompute(policy, temperature, top_k):
    obs = make_obs(3, seed=1)
    sample = policy.act(obs, temperature=temperature, top_k=top_k, generator=torch.Generator().manual_seed(3))
    ev = policy.evaluate(sample.inputs, sample.action_token_ids, temperature=temperature, top_k=top_k)
    assert ev.log_probs.shape == ev.entropy.shape == (3, policy.chunk_size, 7)
    assert (ev.log_probs - sample.log_probs).abs().max().item() <= 1e-5
    assert (ev.values - sample.values).abs().max().item() <= 1e-5
    # the check is sharp: another temperature gives other log-probs
    other = policy.evaluate(sample.inputs, sample.action_token_ids, temperature=temperature * 2, top_k=top_k)
    assert (other.log_probs - sample.log_probs).abs().max().item() > 1e-3
    if top_k is not None:  # entropy of a top-k distribution is at most log k
        assert ev.entropy.max().item() <= torch.log(torch.tensor(float(top_k))).item() + 1e-5


def test_evaluate_is_differentiable(policy):
    sample = policy.act(make_obs(2))
    ev = policy.evaluate(sample.inputs, sample.action_token_ids)
    (ev.log_probs.sum() + ev.values.sum() + ev.entropy.sum()).backward()
    lm_q = policy.core.language_model.model.layers[0].self_attn.q_proj.weight
    assert lm_q.grad is not None and lm_q.grad.abs().sum() > 0
    assert policy.core.value_head.fc1.weight.grad.abs().sum() > 0
    policy.core.zero_grad(set_to_none=True)


def test_padded_rows_compute_what_they_compute_alone(policy):
    obs = make_obs(3, seed=2)  # three instructions of different lengths -> left padding
    batch = policy.prepare(obs)
    assert not batch.attention_mask.all()
    tokens = policy.act(batch, greedy=True).action_token_ids
    logits = policy.core(batch.pixel_values, batch.input_ids, batch.attention_mask, action_token_ids=tokens)
    for i in range(3):
        one = policy.prepare({"image": obs["image"][i : i + 1], "instruction": (obs["instruction"][i],)})
        assert one.attention_mask.all()
        alone = policy.core(
            one.pixel_values, one.input_ids, one.attention_mask, action_token_ids=tokens[i : i + 1]
        )
        torch.testing.assert_close(alone.action_logits[0], logits.action_logits[i], atol=1e-5, rtol=1e-5)


def test_greedy_is_deterministic_and_the_mode(policy):
    obs = make_obs(3, seed=4)
    a = policy.act(obs, greedy=True, temperature=0.6)
    b = policy.act(obs, greedy=True, temperature=0.6)
    assert torch.equal(a.action_token_ids, b.action_token_ids)
    out = policy.core(
        a.inputs.pixel_values,
        a.inputs.input_ids,
        a.inputs.attention_mask,
        action_token_ids=a.action_token_ids,
    )
    first = policy.core.action_tokenizer.first_action_id
    assert torch.equal(out.action_logits.argmax(-1) + first, a.action_token_ids)
    # top_k=1 sampling is greedy too
    c = policy.act(obs, top_k=1, generator=torch.Generator().manual_seed(9))
    assert torch.equal(c.action_token_ids, a.action_token_ids)
    assert torch.allclose(c.log_probs, torch.zeros_like(c.log_probs))


def test_sampling_follows_the_generator(policy):
    obs = make_obs(2, seed=5)
    a = policy.act(obs, generator=torch.Generator().manual_seed(1)).action_token_ids
    b = policy.act(obs, generator=torch.Generator().manual_seed(1)).action_token_ids
    c = policy.act(obs, generator=torch.Generator().manual_seed(2)).action_token_ids
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("preset", PRESETS)
def test_action_level_values_have_one_value_per_chunk_step(preset):
    model, tok = tiny(preset, value_type="action_level")
    pol = policy_for(model, tok)
    sample = pol.act(make_obs(2))
    assert sample.values.shape == (2, pol.chunk_size)
    no_value, tok = tiny(preset)
    assert policy_for(no_value, tok).act(make_obs(2)).values is None


def test_param_groups_split_the_value_head(policy):
    groups = policy.param_groups(lr=1e-4, value_lr=3e-3)
    assert [g["name"] for g in groups] == ["policy", "value_head"]
    value_ids = {id(p) for p in policy.core.value_head.parameters()}
    assert {id(p) for p in groups[1]["params"]} == value_ids
    assert not value_ids & {id(p) for p in groups[0]["params"]}
    assert groups[1]["lr"] == 3e-3
    opt = torch.optim.AdamW(groups)  # usable as is
    assert len(opt.param_groups) == 2


def test_prompt_end_token_replaces_the_trailing_space():
    model, tok = tiny("tiny-openvla")
    space_id = tok.convert_tokens_to_ids("Ġ")  # the byte tokenizer's " "
    with_end = build_config("tiny-openvla", prompt_end_token_id=space_id)
    plain = tokenize_prompts(tok, INSTRUCTIONS, model.config)
    assert all(
        torch.equal(a, b) for a, b in zip(plain, tokenize_prompts(tok, INSTRUCTIONS, with_end), strict=True)
    )
    assert (plain[0][:, -1] == space_id).all()  # every prompt ends at the last column


def test_gradient_checkpointing_gives_the_same_gradients():
    model, tok = tiny("tiny-openvla-oft", value_type="chunk_level")
    pol = policy_for(model, tok)
    sample = pol.act(make_obs(2))
    model.train()

    def grads():
        model.zero_grad(set_to_none=True)
        ev = pol.evaluate(sample.inputs, sample.action_token_ids)
        (ev.log_probs.sum() + ev.values.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = grads()
    # transformers 5.x renamed gradient_checkpointing_enable; older 5.x releases only have that
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()
    assert any(getattr(m, "gradient_checkpointing", False) for m in model.vision_backbone.modules())
    checkpointed = grads()
    assert plain.keys() == checkpointed.keys()
    assert all(torch.allclose(plain[n], checkpointed[n], atol=1e-6) for n in plain)


def test_policy_inputs_index_and_prompt_layout(policy):
    inputs = policy.prepare(make_obs(3))
    sub = inputs[torch.tensor([0, 2])]
    assert isinstance(sub, PolicyInputs) and sub.input_ids.shape[0] == 2
    text = policy.tokenizer.decode(inputs.input_ids[0][inputs.attention_mask[0]])
    assert text == f"In: What action should the robot take to {INSTRUCTIONS[0].lower()}?\nOut: "


@pytest.mark.parametrize("preset", ["tiny-openvla", "tiny-openvla-oft"])
def test_a_bfloat16_model_keeps_exactly_k_tokens(preset):
    """Rounded to bfloat16, many of a row's 256 action logits tie, and top-k kept every token tied at
    the k-th value. The action logits are float32 from the bfloat16 hidden states: k tokens."""
    from vla_trainer.models.sampling import processed_logits

    model, _ = tiny(preset)
    model = model.to(torch.bfloat16)
    width = model.get_output_embeddings().in_features
    hidden = torch.randn(64, width, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    kept = torch.isfinite(processed_logits(model.action_logits_from_hidden(hidden), 1.0, 50)).sum(-1)
    assert (kept == 50).all(), kept.max()
