"""GRPO: trajectory scores, group-relative advantages, valid-action mask, length weights, filter."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_trainer.algorithms import (
    first_done_mask,
    group_advantages,
    length_normalization_weights,
    ppo_policy_loss,
    success_rate_filter,
    trajectory_scores,
    uniform_groups,
)

# T=4 steps, N=3 envs: env 0 done at t=1, env 1 done at t=2 (and again at t=3), env 2 never
DONES = torch.tensor(
    [[0, 0, 0],
     [1, 0, 0],
     [0, 1, 0],
     [1, 1, 0]], dtype=torch.bool,
)
REWARDS = torch.tensor(
    [[1.0, 0.0, 1.0],
     [2.0, 0.0, 1.0],
     [3.0, 1.0, 1.0],
     [4.0, 5.0, 1.0]],
)


def test_first_done_mask_keeps_steps_up_to_and_including_the_first_done():
    expected = torch.tensor(
        [[1, 1, 1],
         [1, 1, 1],
         [0, 1, 1],
         [0, 0, 1]], dtype=torch.bool,
    )
    assert torch.equal(first_done_mask(DONES), expected)


def test_first_done_mask_action_level_runs_over_sub_steps_in_order():
    # T=2 chunks, N=1, C=2: done at (t=0, j=1) -> (0,0), (0,1) kept, chunk 1 dropped
    dones = torch.tensor([[[False, True]], [[True, False]]])
    assert torch.equal(first_done_mask(dones), torch.tensor([[[True, True]], [[False, False]]]))
    # done at (t=1, j=0): everything up to it
    dones = torch.tensor([[[False, False]], [[True, True]]])
    assert torch.equal(first_done_mask(dones), torch.tensor([[[True, True]], [[True, False]]]))


def test_trajectory_scores_sum_rewards_up_to_first_done():
    # env 0: 1 + 2 = 3; env 1: 0 + 0 + 1 = 1 (the 5 after its first done is not counted);
    # env 2: never done, 1 + 1 + 1 + 1 = 4
    assert torch.equal(trajectory_scores(REWARDS, DONES), torch.tensor([3.0, 1.0, 4.0]))


def test_trajectory_scores_action_level():
    rewards = torch.tensor([[[1.0, 2.0]], [[3.0, 4.0]]])
    dones = torch.tensor([[[False, False]], [[True, False]]])
    assert torch.equal(trajectory_scores(rewards, dones), torch.tensor([6.0]))  # 1 + 2 + 3


def test_group_advantages_with_known_returns():
    # group 0 = (1, 0, 0, 1): mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3)
    # group 1 = (5, 5, 5, 5): std 0 -> advantages 0
    scores = torch.tensor([1.0, 0.0, 0.0, 1.0, 5.0, 5.0, 5.0, 5.0], dtype=torch.float64)
    a = 0.5 / (math.sqrt(1 / 3) + 1e-6)  # = 0.866023904...
    expected = torch.tensor([a, -a, -a, a, 0, 0, 0, 0], dtype=torch.float64)
    torch.testing.assert_close(group_advantages(scores, 4), expected)


def test_group_advantages_pairs_and_population_std():
    # group (0, 3): mean 1.5, sample std sqrt(2 * 1.5**2 / 1) = 1.5 * sqrt(2) -> -+1/sqrt(2)
    # group (2, 2): 0
    a = 1.5 / (1.5 * math.sqrt(2) + 1e-6)  # = 0.7071063...
    out = group_advantages(torch.tensor([0.0, 3.0, 2.0, 2.0], dtype=torch.float64), 2)
    torch.testing.assert_close(out, torch.tensor([-a, a, 0.0, 0.0], dtype=torch.float64))
    # population std of (1, 0, 0, 1) is 0.5 -> exactly -+1
    out = group_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), 4, eps=0.0, unbiased=False)
    torch.testing.assert_close(out, torch.tensor([1.0, -1.0, -1.0, 1.0]))


def test_group_advantage_errors():
    with pytest.raises(ValueError, match="group_size=3"):
        group_advantages(torch.zeros(8), 3)
    with pytest.raises(ValueError, match="group_size=1"):
        group_advantages(torch.zeros(8), 1)
    with pytest.raises(ValueError, match=r"\[N\]"):
        group_advantages(torch.zeros(2, 4), 2)


def test_length_normalization_weights():
    mask = first_done_mask(DONES)  # lengths 2, 3, 4
    expected = torch.tensor(
        [[1 / 2, 1 / 3, 1 / 4],
         [1 / 2, 1 / 3, 1 / 4],
         [0, 1 / 3, 1 / 4],
         [0, 0, 1 / 4]],
    )
    torch.testing.assert_close(length_normalization_weights(mask), expected)
    # an env without any valid step gets weight 0 (not NaN); sub-step masks count all axes but N
    empty = torch.zeros(3, 2, dtype=torch.bool)
    empty[:, 1] = True
    assert torch.equal(length_normalization_weights(empty)[:, 0], torch.zeros(3))
    action_mask = torch.tensor([[[True, True]], [[True, False]]])  # 3 valid sub-steps
    torch.testing.assert_close(
        length_normalization_weights(action_mask), torch.tensor([[[1 / 3, 1 / 3]], [[1 / 3, 0.0]]])
    )


def test_length_normalised_loss_counts_every_trajectory_equally():
    # ratio 1 everywhere -> per-step loss = -A. Per-step advantages (not GRPO's constant, to
    # make the weighting visible): env 0 steps (2, 4), env 1 (3, 3, 3), env 2 (1, 1, 1, 5)
    mask = first_done_mask(DONES)
    adv = torch.tensor(
        [[2.0, 3.0, 1.0],
         [4.0, 3.0, 1.0],
         [99.0, 3.0, 1.0],
         [99.0, 99.0, 5.0]],
    )
    lp = torch.zeros(4, 3)
    # paper Eq. 12: -(mean(2, 4) + mean(3, 3, 3) + mean(1, 1, 1, 5)) / 3 = -(3 + 3 + 2) / 3
    out = ppo_policy_loss(lp, lp, adv, mask, weights=length_normalization_weights(mask))
    torch.testing.assert_close(out.loss, torch.tensor(-8.0 / 3.0))
    # token-mean instead: -(2 + 4 + 3 + 3 + 3 + 1 + 1 + 1 + 5) / 9 = -23 / 9
    torch.testing.assert_close(ppo_policy_loss(lp, lp, adv, mask).loss, torch.tensor(-23.0 / 9.0))


def test_success_rate_filter_bounds():
    # LIBERO recipe: reward 5 per success, bounds 0.5 / 4.5, group size 4
    scores = torch.tensor([0, 0, 0, 0,   5, 0, 0, 0,   5, 5, 5, 5,   5, 5, 5, 0], dtype=torch.float32)
    keep = success_rate_filter(scores, 4, 0.5, 4.5)  # means 0, 1.25, 5, 3.75
    assert torch.equal(keep, torch.tensor([False, True, False, True]))
    # bounds are inclusive: means exactly 0.5 and 4.5 are kept
    keep = success_rate_filter(torch.tensor([1.0, 0.0, 4.0, 5.0, 4.0, 6.0]), 2, 0.5, 4.5)
    assert torch.equal(keep, torch.tensor([True, True, False]))
    assert torch.equal(keep.repeat_interleave(2), torch.tensor([1, 1, 1, 1, 0, 0], dtype=torch.bool))
    with pytest.raises(ValueError, match="low=4.5 > high=0.5"):
        success_rate_filter(scores, 4, 4.5, 0.5)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.booleans(), min_size=3, max_size=3), min_size=1, max_size=8))
def test_first_done_mask_matches_a_loop(done_rows):
    dones = torch.tensor(done_rows)
    expected = torch.zeros_like(dones)
    for n in range(dones.shape[1]):
        for t in range(dones.shape[0]):
            expected[t, n] = True
            if dones[t, n]:
                break
    assert torch.equal(first_done_mask(dones), expected)


def test_success_rate_filter_default_drops_groups_that_all_scored_alike():
    """The paper's rule (5.3.2): without bounds, all-success and all-fail groups are dropped."""
    scores = torch.tensor([1.0, 1.0, 0.0, 0.0, 1.0, 0.0, 5.0, 5.0])
    assert torch.equal(success_rate_filter(scores, 2), torch.tensor([False, False, True, False]))
    # equal up to float32 summation order (0.1 + 0.1 + 1.0 vs 1.0 + 0.1 + 0.1) is equal
    a = torch.tensor([0.1, 0.1, 1.0]).sum()
    b = torch.tensor([1.0, 0.1, 0.1]).sum()
    assert torch.equal(success_rate_filter(torch.stack([a, b]), 2), torch.tensor([False]))
    assert torch.equal(uniform_groups(torch.stack([a, b, a, a + 0.01]), 2), torch.tensor([True, False]))
    with pytest.raises(ValueError, match="both bounds or neither"):
        success_rate_filter(scores, 2, 0.5, None)


def test_equal_scores_give_exactly_zero_whatever_their_value():
    for value in (0.7, 1.2, 0.3, 123.456):
        scores = torch.full((8,), value)
        assert torch.equal(group_advantages(scores, 8), torch.zeros(8))
        assert torch.equal(group_advantages(scores.double(), 4, unbiased=False), torch.zeros(8, dtype=torch.float64))
