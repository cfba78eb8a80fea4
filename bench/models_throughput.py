"""Env-actions/s of OpenVLA-OFT parallel decoding vs OpenVLA token-by-token decoding (tiny
presets, this CPU), plus one training step's time and peak memory with and without LoRA.

    .venv/bin/python bench/models_throughput.py [--batches 8 32 64] [--threads 1] [--json out.json]

Rollout: both tiny models (same backbone sizes) are built first, then ``policy.act`` is timed
in alternating blocks (median of ``--rounds`` blocks each), so load drift on a shared machine
hits both alike. One OFT call yields ``N x 8`` env actions (one forward); one OpenVLA call
yields ``N`` (a prefill plus 6 cached decode steps).

Training: one PPO-style update of the OFT model (recompute log-probs/entropy/values with
gradients, clipped surrogate + value loss, backward, AdamW step with the value head in its own
parameter group), full fine-tuning vs LoRA. Each runs in its own subprocess. "peak - before" is
the highest resident set size sampled every millisecond over the first update (which allocates
the AdamW state) and the timed ones, minus the resident size before any update: activations,
gradients and optimizer state. "grads+Adam" counts the gradient and AdamW tensors exactly.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time

import numpy as np

INSTRUCTIONS = (
    "put the carrot on the plate",
    "pick up the red cube",
    "push the cube to the goal region",
    "stack the green cube on the red cube",
)


def make_obs(n: int, size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "image": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
        "instruction": tuple(INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n)),
    }


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRSS:
    """Samples the resident set size in a thread; ``peak`` is the maximum seen."""

    def __init__(self, interval_s: float = 0.001):
        self.interval_s, self.peak, self._stop = interval_s, 0, threading.Event()

    def __enter__(self):
        self.peak = rss_bytes()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, rss_bytes())
            time.sleep(self.interval_s)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())


def rollout_throughput(batches: list[int], rounds: int, warmup: int) -> list[dict]:
    import torch

    from vla_trainer.models import VLAPolicy, build_model

    policies = {}
    for name, preset in (("oft", "tiny-openvla-oft"), ("openvla", "tiny-openvla")):
        model, tok = build_model(preset, value_type="chunk_level")
        policies[name] = VLAPolicy(model, tok)
    n_params = sum(p.numel() for p in policies["oft"].model.parameters())
    print(
        f"tiny presets: {n_params / 1e6:.1f} M parameters, {policies['oft'].config.image_size} px, "
        f"chunk {policies['oft'].chunk_size}; torch threads {torch.get_num_threads()}"
    )
    print(f"{'batch':>5} {'model':>8} {'calls/s':>9} {'env-actions/s':>14} {'ratio':>12}")
    rows = []
    for n in batches:
        obs = make_obs(n, policies["oft"].config.image_size)
        inputs = {k: p.prepare(obs) for k, p in policies.items()}
        gen = torch.Generator().manual_seed(0)
        for k, p in policies.items():
            for _ in range(warmup):
                p.act(inputs[k], generator=gen)
        times = {k: [] for k in policies}
        for _ in range(rounds):
            for k, p in policies.items():
                t = time.perf_counter()
                p.act(inputs[k], generator=gen)
                times[k].append(time.perf_counter() - t)
        result = {}
        for k, p in policies.items():
            calls = 1.0 / float(np.median(times[k]))
            result[k] = {"calls_per_s": calls, "env_actions_per_s": calls * n * p.chunk_size}
        ratio = result["oft"]["env_actions_per_s"] / result["openvla"]["env_actions_per_s"]
        for k in ("openvla", "oft"):
            tail = f"{ratio:.2f} x" if k == "oft" else ""
            print(
                f"{n:>5} {k:>8} {result[k]['calls_per_s']:>9.2f} "
                f"{result[k]['env_actions_per_s']:>14.1f} {tail:>12}",
                flush=True,
            )
        rows.append(
            {
                "batch": n,
                **{f"{k}_{m}": v for k, r in result.items() for m, v in r.items()},
                "oft_over_openvla": ratio,
            }
        )
    return rows


def train_worker(mode: str, batch: int, steps: int, lora_rank: int, threads: int) -> dict:
    """One configuration's training-step time and peak memory (run in a fresh process)."""
    import torch

    torch.set_num_threads(threads)
    from vla_trainer.models import VLAPolicy, apply_lora, build_model

    model, tok = build_model("tiny-openvla-oft", value_type="chunk_level")
    if mode == "lora":
        model = apply_lora(model, rank=lora_rank)
    policy = VLAPolicy(model, tok)
    sample = policy.act(make_obs(batch, policy.config.image_size), generator=torch.Generator().manual_seed(0))
    advantages = torch.randn(batch, 1, 1)
    returns = torch.randn(batch, 1)
    optimizer = torch.optim.AdamW(policy.param_groups(lr=1e-4, value_lr=3e-3))
    trainable = sum(p.numel() for g in optimizer.param_groups for p in g["params"])
    model.train()

    def step():
        ev = policy.evaluate(sample.inputs, sample.action_token_ids)
        ratio = (ev.log_probs - sample.log_probs).exp()
        surrogate = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
        loss = -surrogate.mean() + 0.5 * (ev.values - returns).pow(2).mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_([p for g in optimizer.param_groups for p in g["params"]], 10.0)
        optimizer.step()

    before = rss_bytes()
    times = []
    with PeakRSS() as peak:
        step()  # the first step allocates the optimizer state: counted in the peak, not timed
        for _ in range(steps):
            t = time.perf_counter()
            step()
            times.append(time.perf_counter() - t)
    grads_and_state = sum(
        p.grad.nbytes for g in optimizer.param_groups for p in g["params"] if p.grad is not None
    )
    grads_and_state += sum(
        t.nbytes for s in optimizer.state.values() for t in s.values() if torch.is_tensor(t)
    )
    return {
        "mode": mode,
        "batch": batch,
        "trainable_params": trainable,
        "step_s": float(np.median(times)),
        "peak_rss_mb": peak.peak / 2**20,
        "peak_over_before_mb": (peak.peak - before) / 2**20,
        "grads_and_adam_state_mb": grads_and_state / 2**20,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[8, 32, 64])
    p.add_argument("--rounds", type=int, default=5, help="timed calls per model and batch")
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the host has 2 cores)")
    p.add_argument("--train-batch", type=int, default=8)
    p.add_argument("--train-steps", type=int, default=3)
    p.add_argument("--lora-rank", type=int, default=32)
    p.add_argument("--json", default=None, help="also write results here")
    p.add_argument("--train-worker", choices=["full", "lora"], default=None, help=argparse.SUPPRESS)
    args = p.parse_args()

    if args.train_worker:
        print(
            json.dumps(
                train_worker(
                    args.train_worker, args.train_batch, args.train_steps, args.lora_rank, args.threads
                )
            )
        )
        return

    import torch

    torch.set_num_threads(args.threads)
    results = {
        "cpu_count": os.cpu_count(),
        "machine": platform.machine(),
        "torch": torch.__version__,
        "threads": args.threads,
        "rollout": rollout_throughput(args.batches, args.rounds, args.warmup),
    }

    print(f"\ntraining step, tiny-openvla-oft, batch {args.train_batch} (median of {args.train_steps}):")
    print(
        f"{'mode':>5} {'trainable':>11} {'step s':>8} {'peak RSS MB':>12} {'peak - before MB':>17} "
        f"{'grads+Adam MB':>14}"
    )
    results["train"] = []
    for mode in ("full", "lora"):
        cmd = [
            sys.executable,
            __file__,
            "--train-worker",
            mode,
            "--train-batch",
            str(args.train_batch),
            "--train-steps",
            str(args.train_steps),
            "--lora-rank",
            str(args.lora_rank),
            "--threads",
            str(args.threads),
        ]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        row = json.loads(out.strip().splitlines()[-1])
        results["train"].append(row)
        print(
            f"{mode:>5} {row['trainable_params']:>11,} {row['step_s']:>8.3f} {row['peak_rss_mb']:>12.0f} "
            f"{row['peak_over_before_mb']:>17.1f} {row['grads_and_adam_state_mb']:>14.1f}",
            flush=True,
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
