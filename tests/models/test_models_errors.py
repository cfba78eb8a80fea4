"""Bad inputs raise errors that name what was wrong and what is allowed."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from tiny_vla import make_obs, policy_for, tiny

from vla_trainer.models import (
    ConfigMismatchError,
    InvalidInputError,
    OpenVLAForActionPrediction,
    UnknownUnnormKeyError,
    build_config,
    build_tokenizer,
)


@pytest.fixture(scope="module")
def policy():
    model, tok = tiny("tiny-openvla-oft")
    return policy_for(model, tok)


def test_image_of_wrong_dtype(policy):
    obs = make_obs(2)
    obs["image"] = obs["image"].astype(np.float32) / 255
    with pytest.raises(InvalidInputError, match=r"obs\['image'\] must be uint8 .* got dtype torch.float32"):
        policy.act(obs)


def test_image_of_wrong_size(policy):
    obs = make_obs(2, size=96)
    with pytest.raises(
        InvalidInputError, match=r"must be uint8 \[2, 64, 64, 3\].*got shape \[2, 96, 96, 3\]"
    ):
        policy.act(obs)
    obs = make_obs(2)
    obs["image"] = obs["image"][..., :1]  # grayscale
    with pytest.raises(InvalidInputError, match=r"got shape \[2, 64, 64, 1\]"):
        policy.prepare(obs)


def test_image_count_must_match_instructions(policy):
    obs = make_obs(3)
    obs["instruction"] = obs["instruction"][:2]
    with pytest.raises(InvalidInputError, match=r"\[2, 64, 64, 3\].*got shape \[3, 64, 64, 3\]"):
        policy.prepare(obs)


@pytest.mark.parametrize("bad", ["", "   "])
def test_empty_instruction(policy, bad):
    obs = make_obs(2)
    obs["instruction"] = ("pick up the cube", bad)
    with pytest.raises(InvalidInputError, match="instruction is empty"):
        policy.act(obs)


def test_single_string_instead_of_one_per_env(policy):
    obs = make_obs(1)
    obs["instruction"] = "pick up the cube"
    with pytest.raises(InvalidInputError, match="one string per env"):
        policy.prepare(obs)


def test_missing_keys(policy):
    with pytest.raises(InvalidInputError, match="'image'.*'instruction'"):
        policy.prepare({"image": make_obs(1)["image"]})


def test_unknown_unnorm_key_lists_the_available_keys():
    stats = {
        k: {"action": {"q01": [-1] * 7, "q99": [1] * 7}} for k in ("bridge_orig", "fractal20220817_data")
    }
    model, tok = tiny("tiny-openvla", norm_stats=stats)
    with pytest.raises(UnknownUnnormKeyError, match=r"'libero'.*\['bridge_orig', 'fractal20220817_data'\]"):
        policy_for(model, tok, unnorm_key="libero")
    with pytest.raises(UnknownUnnormKeyError, match="pass unnorm_key"):
        policy_for(model, tok)
    assert policy_for(model, tok, unnorm_key="bridge_orig").unnorm_key == "bridge_orig"


def test_config_that_does_not_fit_the_class_names_the_field():
    with pytest.raises(ConfigMismatchError, match="chunk_size"):
        OpenVLAForActionPrediction(build_config("tiny-openvla", chunk_size=8))
    with pytest.raises(ConfigMismatchError, match="value_type"):
        build_config("tiny-openvla-oft", value_type="token_level")
    with pytest.raises(ConfigMismatchError, match=r"fused_vision_config\.image_size"):
        build_config(
            "tiny-openvla",
            fused_vision_config={
                **build_config("tiny-openvla").fused_vision_config.to_dict(),
                "image_size": 96,
            },
        )
    with pytest.raises(ConfigMismatchError, match="text_config.vocab_size"):
        build_config("tiny-openvla", tokenizer_vocab_size=600)


def test_tokenizer_of_another_model_is_rejected():
    model, _ = tiny("tiny-openvla")
    small = build_tokenizer(
        build_config("tiny-openvla", n_action_bins=128, tokenizer_vocab_size=387, pad_token_id=387)
    )
    with pytest.raises(ConfigMismatchError, match="tokenizer"):
        policy_for(model, small)


def test_bad_sampling_arguments_and_tokens(policy):
    with pytest.raises(InvalidInputError, match="temperature must be > 0"):
        policy.act(make_obs(1), temperature=0.0)
    for top_k in (0, 257, 5.0, True):  # a float reached torch.topk (a raw TypeError); True was taken as 1
        with pytest.raises(InvalidInputError, match=r"top_k must be None or an integer in \[1, 256\]"):
            policy.act(make_obs(1), top_k=top_k)
    assert policy.act(make_obs(1), top_k=np.int64(5)).actions.shape == (1, policy.chunk_size, 7)
    inputs = policy.prepare(make_obs(1))
    with pytest.raises(InvalidInputError, match=r"must be \[N, 8, 7\]"):
        policy.evaluate(inputs, torch.zeros(1, 1, 7, dtype=torch.long))
    with pytest.raises(InvalidInputError, match=r"action token ids must lie in \[259, 515\)"):
        policy.evaluate(inputs, torch.full((1, 8, 7), 3, dtype=torch.long))


# ------------------------------------------------------------------ fuzzed observations
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_IMAGES = st.one_of(
    hnp.arrays(st.sampled_from([np.uint8, np.float32, np.int64, np.bool_, np.float16]),
               hnp.array_shapes(min_dims=0, max_dims=5, max_side=70)),
    st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(0, 255), max_size=4))
_INSTRUCTIONS = st.one_of(
    st.lists(st.text(max_size=300), min_size=0, max_size=3).map(tuple),  # empty, blank, over-long, any unicode
    st.text(max_size=20), st.none(), st.integers(), st.lists(st.integers(), max_size=2))


@pytest.mark.reliability(fault="malformed observations into the policy (hypothesis: image shape/dtype, "
                               "instructions empty, over-long or not text)", cases=150,
                         outcome="refused: InvalidInputError naming the key and the expected form")
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=_IMAGES, instruction=_INSTRUCTIONS, state=st.one_of(st.none(), hnp.arrays(np.float32, st.integers(0, 20))))
def test_any_malformed_observation_is_refused_or_acted_on(policy, image, instruction, state):
    """Whatever arrives, the policy acts on a well-formed observation or raises InvalidInputError
    naming the offending key; no other exception escapes."""
    obs = {"image": image, "instruction": instruction}
    if state is not None:
        obs["state"] = state
    try:
        sample = policy.act(obs, temperature=1.0)
    except InvalidInputError as e:
        assert any(k in str(e) for k in ("image", "instruction", "state")), str(e)
        return
    n = len(instruction)
    assert sample.actions.shape == (n, policy.chunk_size, 7) and torch.isfinite(sample.actions).all()
