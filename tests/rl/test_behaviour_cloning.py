"""The behaviour-cloning term of an RL update (algorithm.bc_coef): its gradient is bc_coef times
the demos' NLL gradient, it trains even when the rollout carries no signal, data-parallel ranks
add it once, and bad settings are config errors naming the key."""

from __future__ import annotations

import pytest
import torch
from synthetic_demos import EPISODES, STEPS, write_demos
from test_trainer_update import synthetic_rollout
from tiny_vla import policy_for, tiny

from vla_trainer.build import make_optimizer
from vla_trainer.config import load_config
from vla_trainer.config.loading import ConfigError
from vla_trainer.rl.behaviour_cloning import DemoBatches, load_bc_demos
from vla_trainer.rl.targets import compute_targets
from vla_trainer.rl.update import update_policy


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    return str(write_demos(tmp_path_factory.mktemp("demos")))


def _grpo_without_signal(demos, *overrides):
    """A GRPO update whose groups all scored alike (every advantage 0), with the BC term."""
    cfg = load_config("cpu_grpo_tiny_put_on_plate", [
        "env.train.total_num_envs=2", "algorithm.group_size=2", "actor.global_batch_size=4",
        "actor.micro_batch_size=2",
        f"algorithm.bc_demo_dirs=[{demos}]", *overrides])
    policy = policy_for(*tiny())
    rollout = synthetic_rollout(policy)
    rollout.rewards.zero_()
    targets = compute_targets(rollout, cfg.algorithm, group_size=2)
    return cfg, policy, rollout, targets


def test_demo_batches_hold_every_step_as_tokens_at_the_model_image_size(demos):
    policy = policy_for(*tiny())
    batches = DemoBatches.load([demos], policy)
    assert len(batches) == EPISODES * STEPS
    assert batches.samples.image.shape[1:3] == (policy.config.image_size,) * 2
    assert batches.tokens.shape == (EPISODES * STEPS, policy.chunk_size, 7)
    idx = batches.draw(5, torch.Generator().manual_seed(0))
    assert idx.shape == (5,) and ((0 <= idx) & (idx < len(batches))).all()
    assert (idx == batches.draw(5, torch.Generator().manual_seed(0))).all()  # the update's generator decides


def test_the_step_follows_bc_coef_times_the_demo_nll_gradient(demos):
    """No policy signal: the one gradient the optimizer sees is bc_coef x the NLL gradient of the
    demo samples drawn with the update's generator after its shuffle."""
    cfg, policy, rollout, targets = _grpo_without_signal(
        demos, "algorithm.bc_coef=0.5", "algorithm.bc_batch_size=3", "algorithm.update_epoch=1",
        "actor.optim.clip_grad=1e9")
    batches = load_bc_demos(cfg, policy)
    opt, params = make_optimizer(policy, cfg)
    seen = []
    step = opt.step
    opt.step = lambda *a, **kw: (seen.append([None if p.grad is None else p.grad.clone() for p in params]),
                                 step(*a, **kw))[1]
    reference = policy_for(*tiny())  # the same weights, before the step
    metrics = update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(7),
                            demos=batches)
    assert len(seen) == 1 and metrics["actor/bc_nll"] > 0  # 4 samples / global batch 4: one step

    gen = torch.Generator().manual_seed(7)
    torch.randperm(4, generator=gen)  # the update's shuffle comes first
    idx = batches.draw(3, gen)
    reference.model.train()
    ref_params = [p for p in reference.model.parameters() if p.requires_grad]
    loss = 0.5 * batches.loss(reference, idx)
    assert metrics["actor/bc_nll"] == pytest.approx(loss.item() / 0.5, rel=1e-5)
    loss.backward()
    compared = 0
    for got, p in zip(seen[0], ref_params, strict=True):
        if p.grad is None:
            assert got is None or not got.any()
            continue
        torch.testing.assert_close(got, p.grad, rtol=1e-4, atol=1e-7)
        compared += 1
    assert compared > 10


def test_without_policy_signal_the_bc_term_alone_lowers_the_demo_nll(demos):
    cfg, policy, rollout, targets = _grpo_without_signal(demos, "algorithm.bc_coef=1.0", "actor.optim.lr=1e-3")
    batches = load_bc_demos(cfg, policy)
    everything = torch.arange(len(batches)).numpy()
    with torch.no_grad():
        before = batches.loss(policy, everything).item()
    opt, params = make_optimizer(policy, cfg)
    for it in range(4):
        metrics = update_policy(policy, opt, params, rollout, targets, cfg, it, torch.Generator().manual_seed(it),
                                demos=batches)
        assert metrics["actor/trained"] == 1.0 and "actor/no_signal" not in metrics
    with torch.no_grad():
        after = batches.loss(policy, everything).item()
    assert after < before - 0.1, (before, after)


def test_steps_of_the_bc_term_alone_do_not_dilute_the_policy_metrics(demos):
    """Two GRPO groups, one scored alike: global batches of its samples only take a step of the BC term
    alone. The policy metrics are means over the steps that trained on rollout samples: the same as
    without the BC term (a tiny learning rate keeps the weights, so the same numbers)."""
    metrics = []
    for bc_coef in (0.0, 1.0):
        cfg = load_config("cpu_grpo_tiny_put_on_plate", [
            "env.train.total_num_envs=4", "algorithm.group_size=2", "actor.global_batch_size=2",
            "actor.micro_batch_size=2", "algorithm.update_epoch=1", "actor.optim.lr=1e-12",
            f"algorithm.bc_demo_dirs=[{demos}]", f"algorithm.bc_coef={bc_coef}"])
        policy = policy_for(*tiny())
        rollout = synthetic_rollout(policy, N=4)
        rollout.rewards[:, :2] = 0.0  # envs 0 and 1, one group: no signal
        targets = compute_targets(rollout, cfg.algorithm, group_size=2)
        opt, params = make_optimizer(policy, cfg)
        batches = load_bc_demos(cfg, policy) if bc_coef else None
        metrics.append(update_policy(policy, opt, params, rollout, targets, cfg, 0, torch.Generator().manual_seed(3),
                                     demos=batches))
    assert metrics[1]["actor/sample_fraction"] == 0.5 and "actor/bc_nll" in metrics[1]
    for key in ("actor/entropy", "actor/clipfrac", "actor/approx_kl", "actor/policy_loss"):
        assert metrics[1][key] == pytest.approx(metrics[0][key], rel=1e-4, abs=1e-9), key


@pytest.mark.parametrize("optim", [[], ["actor.optim.weight_decay=0.5", "actor.optim.lr=1e-2"]])
def test_two_data_parallel_ranks_take_the_one_process_step(demos, optim):
    """Each rank runs half the micro-batches; only rank 0 adds the BC term, every rank draws its
    indices, so the summed gradients equal one process's and the generators stay in step. With
    weight decay, the parameters no rank gave a gradient (vision blocks the model does not run) stay
    as they are, as in one process."""
    cfg, _, rollout, _ = _grpo_without_signal(demos, "algorithm.bc_coef=0.5", "actor.optim.clip_grad=1e9", *optim)
    rollout.rewards[0, 0] += 1.0  # a signal in the first group, so the policy term is there too
    targets = compute_targets(rollout, cfg.algorithm, group_size=2)

    def run(world_size):
        policies = [policy_for(*tiny()) for _ in range(world_size)]
        opts = [make_optimizer(p, cfg) for p in policies]
        batches = load_bc_demos(cfg, policies[0])
        gens = [torch.Generator().manual_seed(3) for _ in range(world_size)]
        if world_size == 1:
            update_policy(policies[0], *opts[0], rollout, targets, cfg, 0, gens[0], demos=batches)
            return policies[0], gens
        # both ranks in lock step: rank 0's backward, then rank 1's, summed before the steps
        import threading

        barrier, grads = threading.Barrier(2), {}

        def all_reduce_for(rank):
            def all_reduce(flat):
                grads[rank] = flat.clone()
                barrier.wait()
                flat.copy_(grads[0] + grads[1])
                barrier.wait()
            return all_reduce

        threads = [threading.Thread(target=update_policy, args=(policies[r], *opts[r], rollout, targets, cfg, 0,
                                                                gens[r]),
                                    kwargs=dict(demos=batches, rank=r, world_size=2, all_reduce=all_reduce_for(r)))
                   for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return policies[0], gens

    single, (g1,) = run(1)
    rank0, (ga, gb) = run(2)
    assert torch.equal(ga.get_state(), gb.get_state()) and torch.equal(ga.get_state(), g1.get_state())
    for (k, a), b in zip(single.model.named_parameters(), rank0.model.parameters(), strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6, msg=k)


@pytest.mark.parametrize("overrides,key", [
    (["algorithm.bc_coef=0.1"], "algorithm.bc_demo_dirs"),
    (["algorithm.bc_coef=-1", "algorithm.bc_demo_dirs=[x]"], "algorithm.bc_coef"),
    (["algorithm.bc_batch_size=-2"], "algorithm.bc_batch_size"),
])
def test_bad_settings_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config("cpu_ppo_tiny_put_on_plate", overrides)


def test_a_folder_without_demos_is_a_config_error(tmp_path):
    cfg = load_config("cpu_ppo_tiny_put_on_plate", ["algorithm.bc_coef=0.1", f"algorithm.bc_demo_dirs=[{tmp_path}]"])
    with pytest.raises(ConfigError, match=r"algorithm\.bc_demo_dirs"):
        load_bc_demos(cfg, policy_for(*tiny()))
    assert load_bc_demos(load_config("cpu_ppo_tiny_put_on_plate"), None) is None  # off: nothing loaded
