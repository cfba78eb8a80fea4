"""Action tokenizer (bins, edges, token layout) and un-normalisation."""

from __future__ import annotations

import numpy as np
import pytest
import tiny_vla  # noqa: F401  (sets the offline hub and thread count)
import torch

from vla_trainer.models import ActionTokenizer, UnknownUnnormKeyError, unnormalize_actions
from vla_trainer.models.action_tokenizer import action_stats_tensors, resolve_unnorm_key

TOK = ActionTokenizer(vocab_size=32000, n_bins=256)


def test_action_ids_are_the_last_256_of_the_vocab():
    assert TOK.first_action_id == 32000 - 256
    ids = TOK.encode(torch.linspace(-1, 1, 10001))
    assert int(ids.min()) == 32000 - 256 and int(ids.max()) == 31999
    assert TOK.encode(torch.tensor(-1.0)).item() == 31999  # token = vocab_size - 1 - bin, bin 0
    assert TOK.encode(torch.tensor(1.0)).item() == 31744  # bin 255 only for exactly +1


def test_bins_match_numpy_digitize_on_openvla_edges():
    edges = np.linspace(-1, 1, 256)
    rng = np.random.default_rng(0)
    a = np.concatenate([rng.uniform(-1.2, 1.2, 5000), edges, edges[1:-1] - 1e-12])
    expected = np.digitize(np.clip(a, -1, 1), edges) - 1
    np.testing.assert_array_equal(TOK.actions_to_bins(torch.from_numpy(a)).numpy(), expected)


def test_values_on_an_edge_fall_into_the_interval_above_it():
    edges = TOK.edges()
    for k in (1, 17, 128, 254):
        assert TOK.actions_to_bins(edges[k]).item() == k
        assert TOK.actions_to_bins(edges[k] - 1e-9).item() == k - 1


def test_round_trip_is_within_half_a_bin_and_decodes_to_centres():
    a = torch.rand(2000, dtype=torch.float64) * 2 - 1
    decoded = TOK.decode(TOK.encode(a)).double()
    half_bin = 1.0 / 255
    assert (decoded - a).abs().max().item() <= half_bin + 1e-6
    centres = TOK.centers()
    assert torch.isin(decoded, centres.float().double()).all()
    # +1 exactly (the 256th id) decodes to the last centre, like OpenVLA's clamp
    assert TOK.decode(TOK.encode(torch.tensor(1.0))).item() == pytest.approx(centres[-1].item(), abs=1e-7)
    # re-encoding a centre gives the same token
    ids = TOK.encode(a)
    assert torch.equal(TOK.encode(TOK.decode(ids).double()), ids)


def test_decode_rejects_non_action_tokens():
    with pytest.raises(ValueError, match=r"\[31744, 32000\)"):
        TOK.decode(torch.tensor([5]))


def test_unnormalize_maps_to_quantiles_except_masked_dims():
    q01 = torch.tensor([-0.1, -0.2, 0.0, -1.0, -2.0, 0.5, 0.0])
    q99 = torch.tensor([0.1, 0.2, 1.0, 1.0, 2.0, 1.5, 1.0])
    mask = torch.tensor([True] * 6 + [False])
    a = torch.tensor([[-1.0, 1.0, 0.0, 0.5, -0.5, 0.0, -0.7]])
    out = unnormalize_actions(a, q01, q99, mask)
    expected = torch.tensor([[-0.1, 0.2, 0.5, 0.5, -1.0, 1.0, -0.7]])
    torch.testing.assert_close(out, expected)


def test_resolve_unnorm_key_and_stats():
    stats = {
        "bridge_orig": {"action": {"q01": [0] * 7, "q99": [1] * 7, "mask": [True] * 6 + [False]}},
        "fractal": {"action": {"q01": [0] * 7, "q99": [2] * 7}},
    }
    assert resolve_unnorm_key(stats, "fractal") == "fractal"
    assert resolve_unnorm_key({"only": stats["fractal"]}, None) == "only"
    with pytest.raises(UnknownUnnormKeyError, match=r"unnorm_key, one of \['bridge_orig', 'fractal'\]"):
        resolve_unnorm_key(stats, None)
    q01, q99, mask = action_stats_tensors(stats, "fractal", 7)
    assert mask.all() and q99.tolist() == [2.0] * 7


@pytest.mark.parametrize("convention, model_open, model_close", [
    ("contract", -1.0, 1.0),
    ("openvla", 1.0, 0.0),  # OpenVLA's datasets (its LIBERO fine-tunes): [0, 1], 1 open
    ("panda", 1.0, -1.0),   # the reference's ManiSkill fine-tunes: the raw Panda command, +1 open
])
def test_a_checkpoints_gripper_convention_becomes_the_envs_and_back(convention, model_open, model_close):
    """A reference checkpoint's "open" reached LIBERO as a close (OpenVLA's 1) and its "close" as
    no command at all (0: robosuite keeps the gripper as it is). Decoded actions carry the envs'
    -1 open / +1 close; training targets in that convention become the model's own values."""
    from tiny_vla import policy_for, tiny

    from vla_trainer.models.token_targets import target_token_ids

    stats = {"mixed": {"action": {"q01": [-0.5] * 6 + [0.0], "q99": [0.5] * 6 + [1.0], "mask": [True] * 6 + [False]}}}
    policy = policy_for(*tiny(norm_stats=stats, action_gripper=convention))
    # what the model emits for "open" and for "close": a near value each, through the tokenizer
    emitted = torch.tensor([[[0.1] * 6 + [model_open - 0.1 * np.sign(model_open)]],
                            [[-0.1] * 6 + [model_close + 0.1 * (1 - abs(model_close))]]])
    tokens = policy.core.action_tokenizer.encode(emitted)  # the gripper is not normalised (mask false)
    actions = policy.actions_from_tokens(tokens)
    assert actions[0, 0, 6] < -0.8 and actions[1, 0, 6] > 0.8  # open, close
    np.testing.assert_allclose(actions[:, 0, :6], [[0.05] * 6, [-0.05] * 6], atol=0.01)  # un-normalised only
    # a demo's chunk (the envs' convention) -> the model's tokens -> the same actions again
    demo = np.array([[[0.2, -0.1, 0.0, 0.05, 0.0, -0.05, -1.0], [0.0] * 6 + [1.0]]], np.float32)
    again = policy.actions_from_tokens(target_token_ids(policy, demo))
    np.testing.assert_allclose(again[..., 6], demo[..., 6], atol=0.01)
    np.testing.assert_allclose(again[..., :6], demo[..., :6], atol=0.01)


def test_the_gripper_convention_is_checked():
    from tiny_vla import tiny

    from vla_trainer.models import ConfigMismatchError

    with pytest.raises(ConfigMismatchError, match="action_gripper: 'bridge' is not one of contract, openvla, panda"):
        tiny(action_gripper="bridge")
    assert tiny()[0].config.action_gripper == "contract"  # what our own SFT trains
