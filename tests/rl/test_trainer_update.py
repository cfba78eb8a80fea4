"""The update step on a synthetic rollout (no simulator): gradient accumulation is exact,
critic warm-up leaves the policy alone, NaN stops before any optimizer step, rollouts concatenate."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from tiny_vla import make_obs, policy_for, tiny

from vla_trainer.build import make_optimizer
from vla_trainer.config import load_config
from vla_trainer.rl.rollout import Rollout, concat_rollouts
from vla_trainer.rl.targets import compute_targets, concat_targets
from vla_trainer.rl.update import NonFiniteLossError, update_policy


def synthetic_rollout(policy, T=2, N=2, seed=0) -> Rollout:
    """A rollout whose actions, log-probs and values come from ``policy`` on random images."""
    g = torch.Generator().manual_seed(seed)
    rng = np.random.default_rng(seed)
    images, instr, tokens, lps, vals = [], [], [], [], []
    for t in range(T):
        obs = make_obs(N, seed=seed * 100 + t)
        s = policy.act(obs, generator=g)
        images.append(obs["image"])
        instr.append(list(obs["instruction"]))
        tokens.append(s.action_token_ids)
        lps.append(s.log_probs)
        vals.append(s.values)
    C = policy.chunk_size
    terminated = torch.zeros(T, N, C, dtype=torch.bool)
    terminated[0, 1, 3] = True  # env 1 succeeds mid-chunk in chunk 0 ...
    valid = torch.ones(T, N, C, dtype=torch.bool)
    valid[0, 1, 4:] = False     # ... so the rest of that chunk is invalid
    return Rollout(
        image=np.stack(images), instruction=instr, action_token_ids=torch.stack(tokens),
        log_probs=torch.stack(lps), values=None if vals[0] is None else torch.stack(vals),
        final_values=torch.zeros(T, N), next_values=torch.zeros(N),
        rewards=torch.as_tensor(rng.uniform(0, 1, (T, N, C)), dtype=torch.float32) * valid,
        terminated=terminated, truncated=torch.zeros(T, N, C, dtype=torch.bool), valid=valid)


def _cfg(*overrides):
    return load_config("cpu_ppo_tiny_put_on_plate", ["env.train.total_num_envs=2", *overrides])


def _setup(cfg, value_type="chunk_level"):
    policy = policy_for(*tiny(value_type=value_type))
    rollout = synthetic_rollout(policy)
    return policy, rollout


def _params(policy):
    return {k: v.detach().clone() for k, v in policy.model.named_parameters()}


@pytest.mark.parametrize("logprob_type", ["token_level", "action_level", "chunk_level"])
def test_gradient_accumulation_equals_one_big_batch(logprob_type):
    """global 4 = one micro-batch of 4, or two of 2: the same optimizer step."""
    results = []
    for micro in (4, 2):
        cfg = _cfg("actor.global_batch_size=4", f"actor.micro_batch_size={micro}",
                   f"algorithm.logprob_type={logprob_type}")
        policy, rollout = _setup(cfg)
        targets = compute_targets(rollout, cfg.algorithm)
        opt, params = make_optimizer(policy, cfg)
        before = _params(policy)
        update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
        results.append(_params(policy))
    changed = [k for k in before if not torch.equal(before[k], results[0][k])]
    assert changed, "the update changed no parameter"
    for k in before:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-4, atol=1e-6)


def test_logged_entropy_and_kl_are_token_means_whatever_the_micro_batch():
    """``actor/entropy`` and ``actor/kl_ref`` are means over the global batch's tokens: one micro-batch
    of 4, two of 2 or four of 1 log the same numbers (the loss terms are shares of the global batch;
    the metrics must not be scaled down a second time)."""
    metrics = []
    for micro in (4, 2, 1):
        cfg = _cfg("actor.global_batch_size=4", f"actor.micro_batch_size={micro}", "algorithm.kl_beta=0.1")
        policy, rollout = _setup(cfg)
        ref = copy.deepcopy(policy)
        with torch.no_grad():
            for p in ref.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
        targets = compute_targets(rollout, cfg.algorithm)
        opt, params = make_optimizer(policy, cfg)
        metrics.append(update_policy(policy, opt, params, rollout, targets, cfg, 0,
                                     torch.Generator().manual_seed(0), ref_policy=ref))
    n_bins = policy.model.config.n_action_bins
    assert 0.5 < metrics[0]["actor/entropy"] <= np.log(n_bins) + 1e-4  # a tiny random policy: near uniform
    assert metrics[0]["actor/kl_ref"] > 1e-4
    for m in metrics[1:]:
        for key in ("actor/entropy", "actor/kl_ref", "actor/approx_kl", "actor/clipfrac", "critic/value_clipfrac"):
            assert m[key] == pytest.approx(metrics[0][key], rel=1e-3, abs=1e-6), key


def test_logged_ratio_extremes_and_approx_kl_do_not_depend_on_the_micro_batch():
    """A sample with no valid step has no ratio, and a token that left the top-k (log-ratio -inf)
    counts 0 in approx_kl: one micro-batch of 4, two of 2 or four of 1 log the same ratio_min,
    ratio_max and approx_kl (every ratio here is below 1, so a stand-in 1 would show)."""
    metrics = []
    for micro in (4, 2, 1):
        cfg = _cfg("actor.global_batch_size=4", f"actor.micro_batch_size={micro}", "algorithm.update_epoch=1")
        policy, rollout = _setup(cfg)
        rollout.valid[1, 0] = False  # env 0's second chunk: nothing of it ran
        rollout.valid[0, 0, 1:] = False  # its first: one action (7 tokens, one of them out of the top-k)
        rollout.rewards *= rollout.valid
        offset = 0.05 + 0.1 * torch.rand(rollout.log_probs.shape, generator=torch.Generator().manual_seed(1))
        offset[0, 0] += 1.0  # and far from the policy: it weighs in the mean
        rollout.log_probs = rollout.log_probs + offset  # every ratio exp(-offset) < 1 (one step: all before it)
        rollout.log_probs[0, 0, 0, 0] = float("inf")  # this token's new log-prob is -inf away: ratio 0
        targets = compute_targets(rollout, cfg.algorithm)
        opt, params = make_optimizer(policy, cfg)
        metrics.append(update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0)))
    print([(m["actor/approx_kl"], m["actor/ratio_min"]) for m in metrics], rollout.log_probs.shape); assert metrics[0]["actor/ratio_min"] == 0.0
    ran = rollout.valid[..., None].expand_as(offset).clone()
    ran[0, 0, 0, 0] = False
    assert metrics[0]["actor/ratio_max"] == pytest.approx(float(torch.exp(-offset[ran].min())), rel=1e-4)
    assert 0.01 < metrics[0]["actor/approx_kl"] < 0.1
    for m in metrics[1:]:
        for key in ("actor/ratio_min", "actor/ratio_max", "actor/approx_kl", "actor/clipfrac"):
            assert m[key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-7), (key, m[key], metrics[0][key])


def test_reward_per_step_is_over_the_valid_sub_steps_only():
    policy = policy_for(*tiny())
    rollout = synthetic_rollout(policy)
    rollout.rewards[0, 1, 4:] = 1.0  # after env 1's success: the next episode's, under chunk_reset="immediate"
    valid = rollout.valid
    assert rollout.reward_per_step() == pytest.approx(float(rollout.rewards[valid].mean()))


def test_critic_warmup_trains_only_the_value_head():
    cfg = _cfg("actor.global_batch_size=4", "actor.micro_batch_size=2", "actor.optim.critic_warmup_steps=1")
    policy, rollout = _setup(cfg)
    targets = compute_targets(rollout, cfg.algorithm)
    opt, params = make_optimizer(policy, cfg)
    before = _params(policy)
    metrics = update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
    after = _params(policy)
    moved = {k for k in before if not torch.equal(before[k], after[k])}
    assert moved and all("value_head." in k for k in moved)
    assert metrics["actor/trained"] == 0.0
    update_policy(policy, opt, params, rollout, targets, cfg, 1, torch.Generator().manual_seed(0))
    assert any("value_head." not in k and not torch.equal(after[k], v) for k, v in _params(policy).items())


@pytest.mark.reliability(fault='NaN advantages or loss', cases=1,
                         outcome='stopped before the optimizer step; the last checkpoint kept')
def test_nan_advantages_stop_before_the_optimizer_step():
    cfg = _cfg("actor.global_batch_size=4", "actor.micro_batch_size=2")
    policy, rollout = _setup(cfg)
    targets = compute_targets(rollout, cfg.algorithm)
    targets.advantages[0, 0] = float("nan")
    opt, params = make_optimizer(policy, cfg)
    before = _params(policy)
    with pytest.raises(NonFiniteLossError, match="iteration 3"):
        update_policy(policy, opt, params, rollout, targets, cfg, 3, torch.Generator().manual_seed(0))
    assert all(torch.equal(before[k], v) for k, v in _params(policy).items())


def test_grpo_targets_mask_after_the_first_done_and_weight_by_length():
    cfg = load_config("cpu_grpo_tiny_put_on_plate", ["env.train.total_num_envs=2", "algorithm.group_size=2",
                                                     "actor.global_batch_size=4", "actor.micro_batch_size=2"])
    policy = policy_for(*tiny())
    rollout = synthetic_rollout(policy)
    targets = compute_targets(rollout, cfg.algorithm, group_size=2)
    # env 1 finished in chunk 0: its chunk 1 is masked; env 0 keeps both chunks
    assert targets.mask.tolist() == [[True, True], [True, False]]
    # weights per log-prob entry (token level here), summing to 1 over each trajectory
    assert targets.weights.shape == rollout.log_probs.shape
    assert torch.allclose(targets.weights.transpose(0, 1).reshape(2, -1).sum(1), torch.ones(2))
    # two trajectories in one group: advantages +-1/sqrt(2) * sign(score difference), broadcast to steps
    assert torch.isclose(targets.advantages[0, 0], -targets.advantages[0, 1])
    assert abs(float(targets.advantages[0, 0])) > 0.5 and targets.advantages[1, 1] == 0
    opt, params = make_optimizer(policy, cfg)
    before = _params(policy)
    update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
    assert any(not torch.equal(before[k], v) for k, v in _params(policy).items())


@pytest.mark.parametrize("overrides,skipped", [
    ([], True),                                                   # every group scored alike: no step
    (["algorithm.entropy_bonus=0.01"], False),                    # the entropy term still has a gradient
    (["algorithm.adv_type=gae", "algorithm.loss_type=actor_critic", "actor.model.add_value_head=true"], False),
])
def test_an_update_without_signal_takes_no_optimizer_step(overrides, skipped):
    """GRPO with equal scores in every group: the loss is 0 everywhere, so no step is taken (an
    AdamW step with zero gradients would still move the weights by its momentum); any other loss
    term makes the update run."""
    cfg = load_config("cpu_grpo_tiny_put_on_plate", ["env.train.total_num_envs=2", "algorithm.group_size=2",
                                                     "actor.global_batch_size=4", "actor.micro_batch_size=2",
                                                     *overrides])
    value_type = "chunk_level" if cfg.algorithm.loss_type == "actor_critic" else None
    policy = policy_for(*tiny(value_type=value_type))
    rollout = synthetic_rollout(policy)
    rollout.rewards.zero_()
    targets = compute_targets(rollout, cfg.algorithm, group_size=2)
    opt, params = make_optimizer(policy, cfg)
    # momentum from an earlier step, which a zero-gradient AdamW step would replay
    for p in params:
        p.grad = torch.ones_like(p)
    opt.step()
    before = _params(policy)
    metrics = update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
    unchanged = all(torch.equal(before[k], v) for k, v in _params(policy).items())
    assert unchanged == skipped
    assert metrics.get("actor/no_signal", 0.0) == float(skipped)


@pytest.mark.parametrize("logprob_type", ["token_level", "chunk_level"])
def test_grpo_update_skips_samples_without_advantage_and_gets_the_same_step(logprob_type, monkeypatch):
    """Two GRPO groups, one whose trajectories scored alike (advantage 0): the update runs the
    forward-backward passes on the other group's samples only, and takes the step that passes over
    every sample take."""
    import vla_trainer.rl.update as update

    cfg = load_config("cpu_grpo_tiny_put_on_plate", ["env.train.total_num_envs=4", "algorithm.group_size=2",
                                                     "actor.global_batch_size=8",
                                                     "actor.micro_batch_size=2",
                                                     f"algorithm.logprob_type={logprob_type}"])
    results, evaluated = [], []
    for skip in (True, False):
        policy = policy_for(*tiny())
        rollout = synthetic_rollout(policy, N=4)
        rollout.rewards[:, 2:] = 0.0  # group (2, 3): both score 0, advantage 0
        targets = compute_targets(rollout, cfg.algorithm, group_size=2)
        assert targets.advantages[:, 2:].abs().sum() == 0 and targets.advantages[:, :2].abs().sum() > 0
        if not skip:
            monkeypatch.setattr(update, "contributing_samples", lambda targets, alg: None)
        count = [0]
        evaluate = policy.evaluate
        def counting(inputs, *a, **kw):
            count[0] += len(inputs.pixel_values)
            return evaluate(inputs, *a, **kw)
        policy.evaluate = counting
        opt, params = make_optimizer(policy, cfg)
        before = _params(policy)
        metrics = update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
        results.append(_params(policy))
        evaluated.append(count[0])
        if skip:
            # env 1 ends in chunk 0, so its chunk 1 is masked: 3 of the 8 samples count
            assert metrics["actor/sample_fraction"] == pytest.approx(3 / 8)
    assert any(not torch.equal(before[k], results[0][k]) for k in before)
    for k in before:
        torch.testing.assert_close(results[0][k], results[1][k], rtol=1e-4, atol=1e-6)
    epochs = cfg.algorithm.update_epoch
    assert evaluated == [3 * epochs, 8 * epochs]


def test_concatenated_rollouts_are_one_rollout_of_more_envs():
    policy = policy_for(*tiny(value_type="chunk_level"))
    a, b = synthetic_rollout(policy, seed=1), synthetic_rollout(policy, seed=2)
    both = concat_rollouts([a, b])
    assert both.num_envs == 4 and both.num_chunks == 2
    assert np.array_equal(both.image[:, 2:], b.image) and both.instruction[1][2:] == b.instruction[1]
    assert torch.equal(both.rewards[:, :2], a.rewards)
    cfg = _cfg()
    t = concat_targets([compute_targets(a, cfg.algorithm), compute_targets(b, cfg.algorithm)])
    assert torch.equal(t.advantages[:, 2:], compute_targets(b, cfg.algorithm).advantages)
    obs = both.obs(np.array([0, 1]), np.array([3, 2]))
    assert obs["instruction"] == (b.instruction[0][1], b.instruction[1][0])
    copy.deepcopy(both)  # plain data: picklable / copyable


def test_rank_metrics_merge_keeps_what_only_one_rank_logged():
    from vla_trainer.rl.update import merge_rank_metrics

    merged = merge_rank_metrics([{"actor/clipfrac": 0.1, "actor/grad_norm": 2.0},
                                 {"actor/clipfrac": 0.2, "actor/grad_norm": 2.0, "actor/ratio_min": 0.5,
                                  "actor/ratio_max": 1.5}])
    assert merged == pytest.approx({"actor/clipfrac": 0.3, "actor/grad_norm": 2.0, "actor/ratio_min": 0.5,
                                    "actor/ratio_max": 1.5})


def test_groups_the_success_rate_filter_drops_still_count_in_the_loss_denominator():
    """As the reference's masked mean: a filtered group weighs 0 and the others keep their weight.
    Dividing by the kept trajectories only made an update that keeps 1 group in 2 twice as strong as
    one where the other group has no signal (8x for 1 in 8, late in LIBERO training)."""
    base = ["env.train.total_num_envs=4", "algorithm.group_size=2", "actor.global_batch_size=8",
            "actor.micro_batch_size=2", "actor.optim.clip_grad=1.0e9"]
    grads = []
    for filtered in (True, False):
        cfg = load_config("cpu_grpo_tiny_put_on_plate", base + (
            ["algorithm.success_rate_filter=true", "algorithm.filter_low=0.0", "algorithm.filter_high=10.0"]
            if filtered else []))
        policy = policy_for(*tiny())
        rollout = synthetic_rollout(policy, N=4)
        rollout.rewards[:, :2] *= 0.1  # group (0, 1): mean score about 0.5, kept
        rollout.rewards[:, 2:] *= 10.0  # group (2, 3): about 80, dropped by the filter ...
        if not filtered:
            rollout.rewards[:, 3] = rollout.rewards[:, 2]  # ... or, without it, scoring alike (no signal)
        targets = compute_targets(rollout, cfg.algorithm, group_size=2)
        assert targets.advantages[:, 2:].abs().sum() == 0 and targets.advantages[:, :2].abs().sum() > 0
        opt, params = make_optimizer(policy, cfg)
        seen = []
        step = opt.step
        opt.step = lambda *a, **kw: (seen.append([p.grad.clone() for p in params if p.grad is not None]),
                                     step(*a, **kw))[1]
        update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(0))
        grads.append(seen[0])
    assert len(grads[0]) == len(grads[1]) and any(g.abs().sum() > 0 for g in grads[0])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-8)
