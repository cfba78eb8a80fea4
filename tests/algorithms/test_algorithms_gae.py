"""GAE against hand-computed values and a naive episode-by-episode reference.

Tensors are time-major [T, N] (chunk level) or [T, N, C] (action level). Expected numbers are
worked out in the comments; gamma = lam = 0.5 (gamma * lam = 0.25) keeps them exact in binary.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vla_trainer.algorithms import compute_action_level_gae, compute_gae

F64 = torch.float64


def col(*xs):
    """A [T, 1] float64 column: one env, T steps."""
    return torch.tensor(xs, dtype=F64).reshape(-1, 1)


def bcol(*xs):
    return torch.tensor(xs, dtype=torch.bool).reshape(-1, 1)


def assert_close(actual, expected):
    torch.testing.assert_close(actual, torch.as_tensor(expected, dtype=actual.dtype), rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- hand-computed cases
def test_termination_mid_rollout_cuts_bootstrap_and_carry():
    # t=2: delta = 3 + 0.5*2 - 1.5 = 2.5                    A2 = 2.5
    # t=1: terminated: delta = 2 + 0 - 1 = 1 (no bootstrap)  A1 = 1 (no carry from t=2)
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1                      A0 = 1 + 0.25*1 = 1.25
    out = compute_gae(
        rewards=col(1, 2, 3), values=col(0.5, 1, 1.5),
        terminated=bcol(0, 1, 0), truncated=bcol(0, 0, 0),
        final_values=col(0, 100, 0),  # ignored: terminated
        next_value=torch.tensor([2.0], dtype=F64), gamma=0.5, lam=0.5,
    )
    assert_close(out.advantages, col(1.25, 1.0, 2.5))
    assert_close(out.returns, col(1.75, 2.0, 4.0))


def test_truncation_bootstraps_with_final_value():
    # t=1: truncated: delta = 2 + 0.5*V(final)=0.5*4 - 1 = 3   A1 = 3
    # t=0: delta = 1 + 0.5*1 - 0.5 = 1                          A0 = 1 + 0.25*3 = 1.75
    out = compute_gae(
        col(1, 2, 3), col(0.5, 1, 1.5), bcol(0, 0, 0), bcol(0, 1, 0), col(0, 4, 0),
        torch.tensor([2.0], dtype=F64), gamma=0.5, lam=0.5,
    )
    assert_close(out.advantages, col(1.75, 3.0, 2.5))
    assert_close(out.returns, col(2.25, 4.0, 4.0))


def test_terminated_and_truncated_on_the_same_step_is_a_termination():
    out = compute_gae(
        col(1, 2, 3), col(0.5, 1, 1.5), bcol(0, 1, 0), bcol(0, 1, 0), col(0, 4, 0),
        torch.tensor([2.0], dtype=F64), gamma=0.5, lam=0.5,
    )
    assert_close(out.advantages, col(1.25, 1.0, 2.5))  # as in the termination case


def test_auto_reset_boundary_never_reads_the_next_episodes_value():
    # gamma 0.5, lam 1. env 0 is truncated at t=1 (V(final obs) = 10); with SAME_STEP auto-reset
    # values[2] = 100 is the NEW episode's first state and must not leak into t <= 1.
    #   t=3: delta = 1 + 0.5*5 - 0 = 3.5                 A3 = 3.5
    #   t=2: delta = 1 + 0.5*0 - 100 = -99               A2 = -99 + 0.5*3.5 = -97.25
    #   t=1: truncated: delta = 1 + 0.5*10 - 0 = 6       A1 = 6
    #   t=0: delta = 1 + 0.5*0 - 0 = 1                   A0 = 1 + 0.5*6 = 4
    # env 1 never ends: rewards (0, 0, 0, 1), values 0, next value 2:
    #   A3 = 1 + 0.5*2 = 2, A2 = 0.5*2 = 1, A1 = 0.5, A0 = 0.25
    rewards = torch.tensor([[1, 0], [1, 0], [1, 0], [1, 1]], dtype=F64)
    values = torch.tensor([[0, 0], [0, 0], [100, 0], [0, 0]], dtype=F64)
    truncated = torch.tensor([[0, 0], [1, 0], [0, 0], [0, 0]], dtype=torch.bool)
    final_values = torch.tensor([[-7, -7], [10, -7], [-7, -7], [-7, -7]], dtype=F64)
    out = compute_gae(
        rewards, values, torch.zeros_like(truncated), truncated, final_values,
        torch.tensor([5.0, 2.0], dtype=F64), gamma=0.5, lam=1.0,
    )
    assert_close(out.advantages, [[4.0, 0.25], [6.0, 0.5], [-97.25, 1.0], [3.5, 2.0]])
    assert_close(out.returns, [[4.0, 0.25], [6.0, 0.5], [2.75, 1.0], [3.5, 2.0]])


def test_episode_ending_on_the_last_step_ignores_next_value():
    # the next obs belongs to a new episode: terminated -> A = r - V; truncated -> r + g*Vf - V
    kw = dict(gamma=0.5, lam=0.5, next_value=torch.tensor([1000.0], dtype=F64))
    term = compute_gae(col(1), col(0.25), bcol(1), bcol(0), col(8), **kw)
    trunc = compute_gae(col(1), col(0.25), bcol(0), bcol(1), col(8), **kw)
    assert_close(term.advantages, col(0.75))
    assert_close(trunc.advantages, col(1 + 0.5 * 8 - 0.25))


# rewards (1, 0, 2), values (0.5, 0.25, 1), next value 4, no episode end
#   TD errors: d0 = 1 + 0.5*0.25 - 0.5 = 0.625, d1 = 0 + 0.5*1 - 0.25 = 0.25, d2 = 2 + 0.5*4 - 1 = 3
#   discounted returns (gamma 0.5): G2 = 2 + 0.5*4 = 4, G1 = 0 + 0.5*4 = 2, G0 = 1 + 0.5*2 = 2
#   undiscounted (gamma 1): G2 = 6, G1 = 6, G0 = 7
@pytest.mark.parametrize(
    ("gamma", "lam", "expected"),
    [
        (0.5, 0.0, (0.625, 0.25, 3.0)),            # lam = 0: the TD errors
        (0.5, 1.0, (2 - 0.5, 2 - 0.25, 4 - 1)),    # lam = 1: discounted return minus value
        (1.0, 1.0, (7 - 0.5, 6 - 0.25, 6 - 1)),    # Monte Carlo, undiscounted
        (0.0, 0.7, (1 - 0.5, 0 - 0.25, 2 - 1)),    # gamma = 0: reward minus value
    ],
)
def test_gamma_lambda_edge_cases(gamma, lam, expected):
    out = compute_gae(
        col(1, 0, 2), col(0.5, 0.25, 1), bcol(0, 0, 0), bcol(0, 0, 0), col(0, 0, 0),
        torch.tensor([4.0], dtype=F64), gamma=gamma, lam=lam,
    )
    assert_close(out.advantages, col(*expected))
    assert_close(out.returns, out.advantages + col(0.5, 0.25, 1))


def test_lam_one_equals_discounted_return_computed_by_a_loop():
    # two episodes: truncated at t=2 (V(final) = 3), then running past the end (next value -1)
    rewards, values = [0.5, -1.0, 2.0, 1.0, 0.25], [0.1, 0.2, 0.3, 0.4, 0.5]
    gamma = 0.9
    expected, g = [0.0] * 5, -1.0
    for t in reversed(range(5)):
        if t == 2:
            g = 3.0
        g = rewards[t] + gamma * g
        expected[t] = g - values[t]
    out = compute_gae(
        col(*rewards), col(*values), bcol(0, 0, 0, 0, 0), bcol(0, 0, 1, 0, 0), col(0, 0, 3, 0, 0),
        torch.tensor([-1.0], dtype=F64), gamma=gamma, lam=1.0,
    )
    torch.testing.assert_close(out.advantages, col(*expected))


def test_invalid_steps_of_a_finished_env_are_zero_and_ignored():
    # auto_reset=False: the env terminated at t=0 and stays finished (invalid, garbage rewards)
    out = compute_gae(
        col(1, 9, 9), col(0.25, 5, 5), bcol(1, 1, 0), bcol(0, 1, 1), col(0, 0, 0),
        torch.tensor([3.0], dtype=F64), gamma=0.5, lam=0.5, valid=bcol(1, 0, 0),
    )
    assert_close(out.advantages, col(0.75, 0, 0))
    assert_close(out.returns, col(1.0, 0, 0))


# --------------------------------------------------------------------------- action level
def test_action_level_skips_invalid_sub_steps():
    # T=2 chunks, N=1, C=2, gamma = lam = 0.5. Execution order k = (t, j):
    #   k0 = (0,0): r 1, V 0.5, terminated           k1 = (0,1): INVALID (reward 7 and a
    #   k2 = (1,0): r 0, V 1 (new episode)                        terminated flag: ignored)
    #   k3 = (1,1): r 2, V 1                          next value 2
    # k3: delta = 2 + 0.5*2 - 1 = 2                  A = 2
    # k2: delta = 0 + 0.5*1 - 1 = -0.5               A = -0.5 + 0.25*2 = 0
    # k0: terminated: delta = 1 - 0.5 = 0.5          A = 0.5 (no carry)
    rewards = torch.tensor([[[1, 7]], [[0, 2]]], dtype=F64)
    values = torch.tensor([[[0.5, 0.5]], [[1, 1]]], dtype=F64)
    terminated = torch.tensor([[[1, 1]], [[0, 0]]], dtype=torch.bool)
    valid = torch.tensor([[[1, 0]], [[1, 1]]], dtype=torch.bool)
    out = compute_action_level_gae(
        rewards, values, terminated, torch.zeros_like(terminated), torch.zeros(2, 1, dtype=F64),
        torch.tensor([2.0], dtype=F64), gamma=0.5, lam=0.5, valid=valid,
    )
    assert_close(out.advantages, [[[0.5, 0.0]], [[0.0, 2.0]]])
    assert_close(out.returns, [[[1.0, 0.0]], [[1.0, 3.0]]])


def test_action_level_truncation_with_chunk_final_values():
    # as above but k0 is truncated with V(final obs) = 4 (given per chunk, [T, N]):
    # k0: delta = 1 + 0.5*4 - 0.5 = 2.5, A = 2.5
    rewards = torch.tensor([[[1, 0]], [[0, 2]]], dtype=F64)
    values = torch.tensor([[[0.5, 0.5]], [[1, 1]]], dtype=F64)
    truncated = torch.tensor([[[1, 0]], [[0, 0]]], dtype=torch.bool)
    valid = torch.tensor([[[1, 0]], [[1, 1]]], dtype=torch.bool)
    out = compute_action_level_gae(
        rewards, values, torch.zeros_like(truncated), truncated,
        torch.tensor([[4.0], [0.0]], dtype=F64), torch.tensor([2.0], dtype=F64),
        gamma=0.5, lam=0.5, valid=valid,
    )
    assert_close(out.advantages, [[[2.5, 0.0]], [[0.0, 2.0]]])


def test_action_level_invalid_sub_step_without_done_passes_the_recursion_through():
    # a mask hole after a step that did NOT end its episode: k0's successor is k2 (one gamma)
    # k3: delta = 2 + 0.5*2 - 1 = 2                  A = 2
    # k2: delta = 1 + 0.5*1 - 1 = 0.5                A = 0.5 + 0.25*2 = 1
    # k0: delta = 1 + 0.5*V(k2)=0.5 - 0.5 = 1        A = 1 + 0.25*1 = 1.25
    rewards = torch.tensor([[[1, 50]], [[1, 2]]], dtype=F64)
    values = torch.tensor([[[0.5, 50]], [[1, 1]]], dtype=F64)
    flags = torch.zeros(2, 1, 2, dtype=torch.bool)
    valid = torch.tensor([[[1, 0]], [[1, 1]]], dtype=torch.bool)
    out = compute_action_level_gae(
        rewards, values, flags, flags, torch.zeros(2, 1, 2, dtype=F64),
        torch.tensor([2.0], dtype=F64), gamma=0.5, lam=0.5, valid=valid,
    )
    assert_close(out.advantages, [[[1.25, 0.0]], [[1.0, 2.0]]])


def test_action_level_order_is_chunk_major():
    # N=2 envs, C=2, no dones, gamma 0.5, lam 1, V=0, next value 0:
    # env 0 rewards (t0: 1, 0; t1: 0, 0) -> A = 1, 0, 0, 0
    # env 1 rewards (t0: 0, 0; t1: 0, 8) -> A(k) = 8 * 0.5**(3-k) = 1, 2, 4, 8
    rewards = torch.tensor([[[1, 0], [0, 0]], [[0, 0], [0, 8]]], dtype=F64)
    zeros = torch.zeros_like(rewards)
    flags = torch.zeros_like(rewards, dtype=torch.bool)
    out = compute_action_level_gae(
        rewards, zeros, flags, flags, zeros, torch.zeros(2, dtype=F64), gamma=0.5, lam=1.0,
    )
    assert_close(out.advantages, [[[1, 0], [1, 2]], [[0, 0], [4, 8]]])


def test_errors_name_the_problem():
    z = torch.zeros(3, 2)
    b = torch.zeros(3, 2, dtype=torch.bool)
    with pytest.raises(ValueError, match="next_value"):
        compute_gae(z, z, b, b, z, torch.zeros(3), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="rewards"):
        compute_gae(torch.zeros(2, 2), z, b, b, z, torch.zeros(2), gamma=0.9, lam=0.9)
    with pytest.raises(ValueError, match="gamma"):
        compute_gae(z, z, b, b, z, torch.zeros(2), gamma=1.5, lam=0.9)
    with pytest.raises(ValueError, match="lam"):
        compute_gae(z, z, b, b, z, torch.zeros(2), gamma=0.9, lam=-0.1)
    with pytest.raises(ValueError, match=r"\[T, N, C\]"):
        compute_action_level_gae(z, z, b, b, z, torch.zeros(2), gamma=0.9, lam=0.9)


# --------------------------------------------------------------------------- naive reference
def naive_gae(r, v, term, trunc, final, next_v, valid, gamma, lam):
    """Per env: drop invalid steps, split into episodes, sum (gamma*lam)^k * delta explicitly."""
    num_steps, num_envs = len(r), len(r[0])
    adv = [[0.0] * num_envs for _ in range(num_steps)]
    for n in range(num_envs):
        episodes, current = [], []
        for t in range(num_steps):
            if not valid[t][n]:
                continue
            current.append(t)
            if term[t][n] or trunc[t][n]:
                episodes.append(current)
                current = []
        if current:
            episodes.append(current)  # still running when the rollout ends
        for ep in episodes:
            last = ep[-1]
            if term[last][n]:
                end = 0.0
            elif trunc[last][n]:
                end = final[last][n]
            else:
                end = next_v[n]
            v_next = [v[t][n] for t in ep[1:]] + [end]
            deltas = [r[t][n] + gamma * vn - v[t][n] for t, vn in zip(ep, v_next)]
            for i, t in enumerate(ep):
                adv[t][n] = sum((gamma * lam) ** k * deltas[i + k] for k in range(len(ep) - i))
    return adv


floats = st.floats(-10, 10, allow_nan=False, width=32)


@st.composite
def rollouts(draw, shape_t=st.integers(1, 7), shape_n=st.integers(1, 3)):
    T, N = draw(shape_t), draw(shape_n)
    grid = lambda s: draw(st.lists(st.lists(s, min_size=N, max_size=N), min_size=T, max_size=T))
    return dict(
        r=grid(floats), v=grid(floats), final=grid(floats),
        term=grid(st.booleans()), trunc=grid(st.booleans()), valid=grid(st.booleans()),
        next_v=draw(st.lists(floats, min_size=N, max_size=N)),
        gamma=draw(st.floats(0, 1)), lam=draw(st.floats(0, 1)),
    )


@settings(max_examples=150, deadline=None)
@given(rollouts())
def test_gae_matches_naive_episode_by_episode_reference(ro):
    t = lambda x, dt=F64: torch.tensor(x, dtype=dt)
    out = compute_gae(
        t(ro["r"]), t(ro["v"]), t(ro["term"], torch.bool), t(ro["trunc"], torch.bool),
        t(ro["final"]), t(ro["next_v"]), gamma=ro["gamma"], lam=ro["lam"],
        valid=t(ro["valid"], torch.bool),
    )
    expected = naive_gae(**ro)
    torch.testing.assert_close(out.advantages, t(expected), rtol=1e-9, atol=1e-9)
    masked_values = torch.where(t(ro["valid"], torch.bool), t(ro["v"]), 0.0)
    torch.testing.assert_close(out.returns, t(expected) + masked_values, rtol=1e-9, atol=1e-9)


@settings(max_examples=100, deadline=None)
@given(rollouts(shape_t=st.integers(1, 6)), st.integers(1, 3))
def test_action_level_gae_matches_naive_reference_on_sub_steps(ro, chunk_size):
    # reuse the drawn [S, N] grids as sub-steps: pad S up to a multiple of C with invalid steps
    steps, num_envs = len(ro["r"]), len(ro["r"][0])
    pad = (-steps) % chunk_size
    for key, fill in (("r", 0.0), ("v", 0.0), ("final", 0.0), ("term", False), ("trunc", False),
                      ("valid", False)):
        ro[key] = ro[key] + [[fill] * num_envs for _ in range(pad)]
    num_chunks = (steps + pad) // chunk_size

    def to_tnc(grid, dt=F64):  # sub-step k = t*C + j of env n -> [t, n, j], built by loops
        out = torch.zeros(num_chunks, num_envs, chunk_size, dtype=dt)
        for t in range(num_chunks):
            for n in range(num_envs):
                for j in range(chunk_size):
                    out[t, n, j] = grid[t * chunk_size + j][n]
        return out

    out = compute_action_level_gae(
        to_tnc(ro["r"]), to_tnc(ro["v"]), to_tnc(ro["term"], torch.bool),
        to_tnc(ro["trunc"], torch.bool), to_tnc(ro["final"]), torch.tensor(ro["next_v"], dtype=F64),
        gamma=ro["gamma"], lam=ro["lam"], valid=to_tnc(ro["valid"], torch.bool),
    )
    torch.testing.assert_close(out.advantages, to_tnc(naive_gae(**ro)), rtol=1e-9, atol=1e-9)
