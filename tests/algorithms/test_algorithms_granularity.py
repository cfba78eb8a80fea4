"""Reward / log-prob / value granularity: reductions, paper Table 1 validation, broadcasting."""

from __future__ import annotations

import pytest
import torch

from vla_trainer.algorithms import (
    align_values,
    broadcast_advantages,
    reduce_flags,
    reduce_log_probs,
    reduce_rewards,
    validate_granularity,
)

# T=2 chunks, N=1 env, C=3 sub-steps; the env finished at sub-step 1 of chunk 0, so sub-step 2
# is invalid (and, as under chunk_reset="immediate", carries the next episode's reward 100).
REWARDS = torch.tensor([[[1.0, 2.0, 100.0]], [[4.0, 5.0, 6.0]]])
VALID = torch.tensor([[[True, True, False]], [[True, True, True]]])


def test_chunk_level_rewards_sum_valid_sub_steps():
    assert torch.equal(reduce_rewards(REWARDS, "chunk_level", VALID), torch.tensor([[3.0], [15.0]]))
    assert torch.equal(reduce_rewards(REWARDS, "chunk_level"), torch.tensor([[103.0], [15.0]]))


def test_action_level_rewards_zero_invalid_sub_steps():
    expected = torch.tensor([[[1.0, 2.0, 0.0]], [[4.0, 5.0, 6.0]]])
    assert torch.equal(reduce_rewards(REWARDS, "action_level", VALID), expected)


def test_flags_reduce_with_any_over_valid_sub_steps():
    terminated = torch.tensor([[[False, True, True]], [[False, False, True]]])
    assert torch.equal(reduce_flags(terminated, "chunk_level", VALID), torch.tensor([[True], [True]]))
    # a flag reported only on an invalid sub-step is not the chunk's episode ending
    only_invalid = torch.tensor([[[False, False, True]], [[False, False, False]]])
    assert torch.equal(reduce_flags(only_invalid, "chunk_level", VALID), torch.tensor([[False], [False]]))
    assert torch.equal(
        reduce_flags(only_invalid, "action_level", VALID), torch.zeros(2, 1, 3, dtype=torch.bool)
    )
    dead = torch.tensor([[[False, False, False]], [[True, True, True]]])  # no auto-reset
    assert torch.equal(reduce_flags(dead, "chunk_level"), torch.tensor([[False], [True]]))


def test_log_prob_reductions():
    # one chunk of one env, C=2 actions x A=3 tokens
    lp = torch.tensor([[[-1.0, -2.0, -3.0], [-0.5, -0.25, -0.125]]])  # [N=1, C=2, A=3]
    assert torch.equal(reduce_log_probs(lp, "token_level"), lp)
    assert torch.equal(reduce_log_probs(lp, "action_level"), torch.tensor([[-6.0, -0.875]]))
    assert torch.equal(reduce_log_probs(lp, "chunk_level"), torch.tensor([-6.875]))
    valid = torch.tensor([[True, False]])
    assert torch.equal(reduce_log_probs(lp, "chunk_level", valid), torch.tensor([-6.0]))
    assert torch.equal(reduce_log_probs(lp, "action_level", valid), torch.tensor([[-6.0, 0.0]]))
    assert torch.equal(reduce_log_probs(lp, "token_level", valid)[0, 1], torch.zeros(3))
    # leading [T, N] axes are kept
    assert reduce_log_probs(torch.zeros(5, 4, 8, 7), "action_level").shape == (5, 4, 8)
    assert reduce_log_probs(torch.zeros(5, 4, 8, 7), "chunk_level").shape == (5, 4)


@pytest.mark.parametrize("reward_type", ["chunk_level", "action_level"])
@pytest.mark.parametrize("logprob_type", ["chunk_level", "action_level", "token_level"])
def test_table_1(reward_type, logprob_type):
    supported = not (reward_type == "action_level" and logprob_type == "chunk_level")
    if supported:
        assert validate_granularity(reward_type, logprob_type) == reward_type
    else:
        with pytest.raises(ValueError, match="Table 1.*no finer than the log-prob"):
            validate_granularity(reward_type, logprob_type)


def test_value_type_must_not_be_finer_than_the_advantage():
    with pytest.raises(ValueError, match="value must be no finer than the advantage"):
        validate_granularity("chunk_level", "token_level", "action_level")
    assert validate_granularity("action_level", "token_level", "chunk_level") == "chunk_level"
    assert validate_granularity("action_level", "action_level", "action_level") == "action_level"
    assert validate_granularity("chunk_level", "chunk_level", "chunk_level") == "chunk_level"


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("step_level", "token_level"), "reward_type"),
        (("chunk_level", "sequence_level"), "logprob_type"),
        (("chunk_level", "token_level", "token_level"), "value_type"),
    ],
)
def test_unknown_names_are_rejected(args, name):
    with pytest.raises(ValueError, match=rf"{name}=.*allowed"):
        validate_granularity(*args)


def test_align_values():
    chunk_critic = torch.tensor([[[1.0], [2.0]]])  # [T=1, N=2, 1]
    assert torch.equal(align_values(chunk_critic, "chunk_level", 3), torch.tensor([[1.0, 2.0]]))
    assert torch.equal(
        align_values(chunk_critic, "action_level", 3), torch.tensor([[[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]])
    )
    action_critic = torch.arange(6.0).reshape(1, 2, 3)
    assert torch.equal(align_values(action_critic, "action_level", 3), action_critic)
    with pytest.raises(ValueError, match="no finer than the advantage"):
        align_values(action_critic, "chunk_level", 3)
    with pytest.raises(ValueError, match=r"\[\.\.\., 1\].*\[\.\.\., 3\]"):
        align_values(torch.zeros(1, 2, 2), "action_level", 3)


def test_broadcast_advantages():
    adv = torch.tensor([[1.0, 2.0]])  # chunk-level [T=1, N=2]
    out = broadcast_advantages(adv, torch.zeros(1, 2, 3, 4))  # token-level log-probs
    assert out.shape == (1, 2, 3, 4)
    assert torch.all(out[0, 0] == 1.0) and torch.all(out[0, 1] == 2.0)
    action_adv = torch.tensor([[[1.0, 2.0, 3.0]]])  # [T=1, N=1, C=3]
    out = broadcast_advantages(action_adv, torch.zeros(1, 1, 3, 2))
    assert torch.equal(out, torch.tensor([[[[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]]]]))
    assert torch.equal(broadcast_advantages(action_adv, torch.zeros(1, 1, 3)), action_adv)
    # an action-level advantage cannot go onto chunk-level log-probs
    with pytest.raises(ValueError, match="no finer than the log-prob"):
        broadcast_advantages(action_adv, torch.zeros(1, 1))
    with pytest.raises(ValueError, match="leading axes"):
        broadcast_advantages(torch.zeros(2, 2), torch.zeros(2, 3, 4))


def test_shape_errors():
    with pytest.raises(ValueError, match=r"\[T, N, C\]"):
        reduce_rewards(torch.zeros(2, 3), "chunk_level")
    with pytest.raises(ValueError, match="valid must"):
        reduce_rewards(torch.zeros(2, 3, 4), "chunk_level", torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="valid must"):
        reduce_log_probs(torch.zeros(2, 3, 4), "chunk_level", torch.ones(2, 4, dtype=torch.bool))
