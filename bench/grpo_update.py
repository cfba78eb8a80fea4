"""One GRPO update of the tiny OpenVLA-OFT on CPU: passes over every sample vs only the samples
with a nonzero advantage (``vla_trainer.rl.update.contributing_samples``).

    .venv/bin/python bench/grpo_update.py [--envs 16] [--group-size 4] [--informative 1] [--rounds 3]
                                          [--bc-demos DIR]

A synthetic rollout shaped like the GRPO recipe's (``--envs`` envs x 10 chunks of 8 steps, 64 px
frames, actions and log-probs sampled from the model): ``--informative`` groups score
differently (one member succeeds), the others all score 0, as when most groups neither grasp
nor place. Both variants start from the same weights and optimizer state and are timed in
alternating rounds (median), so load drift hits both alike; the script also checks that they
take the same step. ``--bc-demos`` (a ``vla-envs collect-demos`` folder) times a third variant
in the same rounds: the second plus the behaviour-cloning term (``algorithm.bc_coef=1``), which
adds one micro-batch of demos to every optimizer step.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time

import numpy as np
import torch

import vla_trainer.rl.update as update
from vla_trainer.build import make_optimizer
from vla_trainer.config import load_config
from vla_trainer.models import VLAPolicy, build_model
from vla_trainer.rl.behaviour_cloning import load_bc_demos
from vla_trainer.rl.rollout import Rollout
from vla_trainer.rl.targets import compute_targets


def grpo_rollout(policy: VLAPolicy, envs: int, chunks: int, group_size: int, informative: int,
                 seed: int = 0) -> Rollout:
    """Frames and instructions at random; in each of the first ``informative`` groups one member
    succeeds in its last chunk (reward 1), every other trajectory scores 0."""
    rng = np.random.default_rng(seed)
    g = torch.Generator().manual_seed(seed)
    images = rng.integers(0, 256, (chunks, envs, 64, 64, 3), dtype=np.uint8)
    instruction = [["put the carrot on the plate"] * envs for _ in range(chunks)]
    tokens, lps = [], []
    for t in range(chunks):
        s = policy.act({"image": images[t], "instruction": tuple(instruction[t])}, generator=g)
        tokens.append(s.action_token_ids)
        lps.append(s.log_probs)
    C = policy.chunk_size
    rewards = torch.zeros(chunks, envs, C)
    terminated = torch.zeros(chunks, envs, C, dtype=torch.bool)
    for k in range(informative):
        rewards[-1, k * group_size, -1] = 1.0
        terminated[-1, k * group_size, -1] = True
    return Rollout(image=images, instruction=instruction, action_token_ids=torch.stack(tokens),
                   log_probs=torch.stack(lps), values=None, final_values=torch.zeros(chunks, envs),
                   next_values=torch.zeros(envs), rewards=rewards, terminated=terminated,
                   truncated=torch.zeros(chunks, envs, C, dtype=torch.bool),
                   valid=torch.ones(chunks, envs, C, dtype=torch.bool))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--envs", type=int, default=16)
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--informative", type=int, default=1, help="groups whose members scored differently")
    ap.add_argument("--global-batch", type=int, default=80)
    ap.add_argument("--micro-batch", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--bc-demos", default=None, help="also time the update with the behaviour-cloning term")
    args = ap.parse_args()
    if args.informative > args.envs // args.group_size:
        ap.error(f"--informative {args.informative} exceeds the {args.envs // args.group_size} groups")
    torch.set_num_threads(args.threads)

    cfg = load_config("cpu_grpo_tiny_put_on_plate", [
        f"env.train.total_num_envs={args.envs}", f"algorithm.group_size={args.group_size}",
        f"actor.global_batch_size={args.global_batch}", f"actor.micro_batch_size={args.micro_batch}"])
    model, tokenizer = build_model("tiny-openvla-oft", seed=0, add_value_head=False)
    policy = VLAPolicy(model, tokenizer)
    chunks = cfg.rollout.steps_per_rollout // policy.chunk_size
    rollout = grpo_rollout(policy, args.envs, chunks, args.group_size, args.informative)
    targets = compute_targets(rollout, cfg.algorithm, group_size=args.group_size)
    start = copy.deepcopy(policy.model.state_dict())

    every_sample = update.contributing_samples
    variants = {"all samples": (lambda targets, alg: None, cfg, None),
                "nonzero advantage only": (every_sample, cfg, None)}
    if args.bc_demos:
        bc_cfg = copy.deepcopy(cfg)
        bc_cfg.algorithm.bc_coef, bc_cfg.algorithm.bc_demo_dirs = 1.0, [args.bc_demos]
        variants["+ behaviour-cloning term"] = (every_sample, bc_cfg, load_bc_demos(bc_cfg, policy))
    times: dict[str, list[float]] = {k: [] for k in variants}
    after: dict[str, dict] = {}
    fraction = None
    for _ in range(args.rounds):
        for name, (chooser, run_cfg, demos) in variants.items():
            policy.model.load_state_dict(start)
            opt, params = make_optimizer(policy, run_cfg)
            update.contributing_samples = chooser
            t0 = time.perf_counter()
            metrics = update.update_policy(policy, opt, params, rollout, targets, run_cfg, 0,
                                           torch.Generator().manual_seed(0), demos=demos)
            times[name].append(time.perf_counter() - t0)
            fraction = metrics.get("actor/sample_fraction", fraction)
            after[name] = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    update.contributing_samples = every_sample

    worst = max(float((after["all samples"][k].float() - after["nonzero advantage only"][k].float()).abs().max())
                for k in start)
    base = statistics.median(times["all samples"])
    print(f"{args.envs} envs x {chunks} chunks, groups of {args.group_size}, {args.informative} informative; "
          f"global batch {args.global_batch}, micro {args.micro_batch}, {cfg.algorithm.update_epoch} epochs; "
          f"{args.threads} threads")
    print(f"samples trained on: {fraction:.3f} of the rollout")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(f"{name:>24}: median {med:6.2f} s over {len(ts)} rounds   speed-up {base / med:4.2f}x")
    print(f"largest weight difference between the two: {worst:.2e}")


if __name__ == "__main__":
    main()
