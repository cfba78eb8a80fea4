"""PPO policy loss, value loss, entropy bonus, KL penalty, critic warm-up: hand-computed values."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_trainer.algorithms import (
    actor_should_update,
    entropy_bonus,
    explained_variance,
    huber,
    k3_kl,
    kl_penalty,
    masked_mean,
    ppo_policy_loss,
    value_loss,
)

F64 = torch.float64
LN2, LN1_5 = math.log(2.0), math.log(1.5)

# Ratios on both sides of the clip range [1 - 0.2, 1 + 0.28] = [0.8, 1.28], advantages of both
# signs, and a masked entry with an absurd log-ratio that must not matter.
#   entry  ratio  A   -A*r    -A*clip(r)   max (loss)   outside range   d loss / d log_prob
#   e0     0.5   +1   -0.5    -0.8         -0.5         yes             -A*r/5 = -0.1
#   e1     0.5   -1   +0.5    +0.8         +0.8         yes             0 (clipped)
#   e2     1.5   +2   -3.0    -2.56        -2.56        yes             0 (clipped)
#   e3     1.5   -1   +1.5    +1.28        +1.5         yes             -A*r/5 = 0.3
#   e4     1.0   +3   -3.0    -3.0         -3.0         no              -A*r/5 = -0.6
#   e5     e^100 +5   masked
RATIOS = [0.5, 0.5, 1.5, 1.5, 1.0, math.exp(100.0)]
ADV = torch.tensor([1.0, -1.0, 2.0, -1.0, 3.0, 5.0], dtype=F64)
MASK = torch.tensor([True, True, True, True, True, False])


def _log_probs():
    old = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5, -1.0], dtype=F64)
    new = (old + torch.tensor([math.log(r) for r in RATIOS], dtype=F64)).requires_grad_(True)
    return new, old


def test_ppo_loss_clip_higher_on_both_sides():
    new, old = _log_probs()
    out = ppo_policy_loss(new, old, ADV, MASK, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(out.loss, torch.tensor((-0.5 + 0.8 - 2.56 + 1.5 - 3.0) / 5, dtype=F64))
    torch.testing.assert_close(out.clipfrac, torch.tensor(4 / 5, dtype=F64))
    # k3: (r - 1) - ln r = ln 2 - 0.5 for r = 0.5, 0.5 - ln 1.5 for r = 1.5, 0 for r = 1
    kl = (2 * (LN2 - 0.5) + 2 * (0.5 - LN1_5)) / 5
    torch.testing.assert_close(out.approx_kl, torch.tensor(kl, dtype=F64))
    torch.testing.assert_close(out.ratio_mean, torch.tensor(1.0, dtype=F64))
    torch.testing.assert_close(out.ratio_min, torch.tensor(0.5, dtype=F64))
    torch.testing.assert_close(out.ratio_max, torch.tensor(1.5, dtype=F64))
    out.loss.backward()
    torch.testing.assert_close(new.grad, torch.tensor([-0.1, 0.0, 0.0, 0.3, -0.6, 0.0], dtype=F64))
    assert not out.clipfrac.requires_grad and not out.approx_kl.requires_grad


@pytest.mark.parametrize("advantage", [1.0, -1.0])
def test_a_token_that_left_the_top_k_has_ratio_0_no_gradient_and_finite_metrics(advantage):
    """Under top-k sampling the update's log-probs use the same truncation, so a sampled token can
    fall out of the new policy's top-k: log-prob -inf, ratio 0. The loss stays finite with no
    gradient from that entry, and approx_kl counts it 0, not inf."""
    old = torch.tensor([-1.0, -2.0, -0.5], dtype=F64)
    new = torch.tensor([-1.0 + LN2, -float("inf"), -0.5], dtype=F64).requires_grad_(True)
    adv = torch.tensor([1.0, advantage, 1.0], dtype=F64)
    out = ppo_policy_loss(new, old, adv, torch.ones(3, dtype=torch.bool), clip_low=0.2, clip_high=0.28)
    assert torch.isfinite(out.loss) and out.ratio_min == 0
    # entry 1: -A * clip(0) = -A * 0.8 when A < 0 (a constant), -A * 0 when A > 0
    expected = (-1.28 + (0.8 if advantage < 0 else 0.0) - 1.0) / 3
    torch.testing.assert_close(out.loss, torch.tensor(expected, dtype=F64))
    torch.testing.assert_close(out.approx_kl, torch.tensor((1.0 - LN2) / 3, dtype=F64))  # entry 0's, over all 3
    out.loss.backward()
    assert torch.isfinite(new.grad).all() and new.grad[1] == 0


def test_ppo_loss_symmetric_clip():
    # [0.8, 1.2]: only e2 changes: -2 * 1.2 = -2.4
    new, old = _log_probs()
    out = ppo_policy_loss(new, old, ADV, MASK)
    torch.testing.assert_close(out.loss, torch.tensor((-0.5 + 0.8 - 2.4 + 1.5 - 3.0) / 5, dtype=F64))


def test_ppo_loss_weights_and_denominator():
    new, old = _log_probs()
    w = torch.tensor([1.0, 1.0, 0.0, 0.0, 2.0, 7.0], dtype=F64)
    # weighted mean: (-0.5 + 0.8 + 2 * -3.0) / (1 + 1 + 2) = -5.7 / 4
    out = ppo_policy_loss(new, old, ADV, MASK, weights=w)
    torch.testing.assert_close(out.loss, torch.tensor(-5.7 / 4, dtype=F64))
    # fixed denominator (e.g. the whole batch's valid count across micro-batches)
    out = ppo_policy_loss(new, old, ADV, MASK, clip_high=0.28, denominator=10)
    torch.testing.assert_close(out.loss, torch.tensor(-3.76 / 10, dtype=F64))


def test_ppo_loss_on_token_level_tensors_and_empty_mask():
    lp = torch.zeros(2, 3, 7)
    out = ppo_policy_loss(lp, lp, torch.ones(2, 3, 7), torch.zeros(2, 3, 7, dtype=torch.bool))
    assert out.loss.item() == 0.0 and out.clipfrac.item() == 0.0
    assert out.ratio_min.item() == 1.0 and out.ratio_max.item() == 1.0


def test_ppo_loss_errors():
    x = torch.zeros(3)
    m = torch.ones(3, dtype=torch.bool)
    with pytest.raises(ValueError, match="broadcast_advantages"):
        ppo_policy_loss(x, x, torch.zeros(3, 1), m)
    with pytest.raises(ValueError, match="clip_low"):
        ppo_policy_loss(x, x, x, m, clip_low=1.0)
    with pytest.raises(ValueError, match="clip_high"):
        ppo_policy_loss(x, x, x, m, clip_high=-0.1)


def test_huber():
    x = torch.tensor([-12.0, 3.0, 10.0, -10.5, 0.0])
    # |x| <= 10: x^2 / 2; beyond: 10 * (|x| - 5)
    torch.testing.assert_close(huber(x), torch.tensor([70.0, 4.5, 50.0, 55.0, 0.0]))
    torch.testing.assert_close(huber(torch.tensor([2.0, -0.5]), 1.0), torch.tensor([1.5, 0.125]))
    torch.testing.assert_close(huber(torch.tensor([30.0]), None), torch.tensor([450.0]))
    with pytest.raises(ValueError, match="delta"):
        huber(x, 0.0)


def test_value_loss_clipping_and_huber():
    #  v     old   R     huber(v - R)            v_clipped (old +- 0.2)   huber(v_clip - R)   max
    #  1.0   0.9   1.2   0.5 * 0.04 = 0.02       1.0                       0.02                0.02
    #  2.0   0.0   30    10 * (28 - 5) = 230     0.2                       10 * (29.8 - 5) = 248   248
    # -0.5   0.0   0.0   0.5 * 0.25 = 0.125     -0.2                       0.02                0.125
    #  9.0   0.0   0.0   masked
    values = torch.tensor([1.0, 2.0, -0.5, 9.0], dtype=F64, requires_grad=True)
    old = torch.tensor([0.9, 0.0, 0.0, 0.0], dtype=F64)
    returns = torch.tensor([1.2, 30.0, 0.0, 0.0], dtype=F64)
    mask = torch.tensor([True, True, True, False])
    out = value_loss(values, old, returns, mask)
    torch.testing.assert_close(out.loss, torch.tensor((0.02 + 248.0 + 0.125) / 3, dtype=F64))
    torch.testing.assert_close(out.clipfrac, torch.tensor(2 / 3, dtype=F64))  # moved 0.1, 2, 0.5
    out.loss.backward()
    # e0: inside the clip range, both branches equal with gradient (v - R) / 3 = -0.2 / 3;
    # e1: the clipped branch wins -> 0; e2: the unclipped one -> (v - R) / 3 = -0.5 / 3
    torch.testing.assert_close(values.grad, torch.tensor([-0.2 / 3, 0.0, -0.5 / 3, 0.0], dtype=F64))
    # no clipping, squared error: (0.04 + 28^2 + 0.25) / 2 / 3
    out = value_loss(values, old, returns, mask, clip=None, huber_delta=None)
    torch.testing.assert_close(out.loss, torch.tensor((0.04 + 784.0 + 0.25) / 2 / 3, dtype=F64))
    assert out.clipfrac.item() == 0.0


def test_entropy_bonus():
    entropy = torch.tensor([1.0, 2.0, 3.0])
    mask = torch.tensor([True, True, False])
    off = entropy_bonus(entropy, mask)
    assert off.loss.item() == 0.0 and off.value.item() == 1.5  # default coefficient 0
    on = entropy_bonus(entropy, mask, coef=0.01)
    torch.testing.assert_close(on.loss, torch.tensor(-0.015))


def test_k3_kl_values():
    # p(x) = 0.5, q(x) = 0.25: r = q/p = 0.5, k3 = 0.5 - 1 - ln 0.5 = ln 2 - 0.5
    out = k3_kl(torch.tensor([math.log(0.5), -1.0]), torch.tensor([math.log(0.25), -1.0]))
    torch.testing.assert_close(out, torch.tensor([LN2 - 0.5, 0.0]))


def test_k3_kl_is_unbiased_for_a_categorical():
    # E_p[k3] = sum_i p_i (q_i/p_i - 1 - ln(q_i/p_i)) = KL(p || q)
    # p = (1/2, 1/4, 1/4), q = (1/4, 1/2, 1/4): KL = 1/2 ln 2 + 1/4 ln(1/2) = ln(2) / 4
    p = torch.tensor([0.5, 0.25, 0.25], dtype=F64)
    q = torch.tensor([0.25, 0.5, 0.25], dtype=F64)
    expectation = (p * k3_kl(p.log(), q.log())).sum()
    torch.testing.assert_close(expectation, torch.tensor(LN2 / 4, dtype=F64))


def test_kl_penalty():
    lp = torch.tensor([math.log(0.5), -1.0, 0.0], requires_grad=True)
    ref = torch.tensor([math.log(0.25), -1.0, -50.0])
    mask = torch.tensor([True, True, False])
    out = kl_penalty(lp, ref, mask, coef=0.1)
    torch.testing.assert_close(out.value, torch.tensor((LN2 - 0.5) / 2))
    torch.testing.assert_close(out.loss, 0.1 * torch.tensor((LN2 - 0.5) / 2))
    assert kl_penalty(lp, ref, mask).loss.item() == 0.0  # off by default
    out.loss.backward()
    assert lp.grad[2].item() == 0.0 and math.isfinite(lp.grad[0].item())


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(-20, 0), st.floats(-20, 0)), min_size=1, max_size=20))
def test_k3_kl_is_non_negative(pairs):
    log_p, log_q = torch.tensor(pairs, dtype=F64).T
    assert torch.all(k3_kl(log_p, log_q) >= -1e-12)


def test_masked_mean_ignores_masked_nan_and_handles_empty_mask():
    x = torch.tensor([1.0, float("nan"), 3.0])
    assert masked_mean(x, torch.tensor([True, False, True])).item() == 2.0
    assert masked_mean(x, torch.zeros(3, dtype=torch.bool)).item() == 0.0


def test_explained_variance():
    # returns (1, 3): Var = 1; returns - values = (0, 1): Var = 0.25 -> 0.75
    ev = explained_variance(torch.tensor([1.0, 2.0, 50.0]), torch.tensor([1.0, 3.0, 0.0]),
                            torch.tensor([True, True, False]))
    torch.testing.assert_close(ev, torch.tensor(0.75))


def test_actor_should_update_after_critic_warmup():
    assert [actor_should_update(step, 3) for step in range(5)] == [False, False, False, True, True]
    assert actor_should_update(0) and actor_should_update(0, 0)
    with pytest.raises(ValueError, match="critic_warmup_steps"):
        actor_should_update(0, -1)
