"""Env-steps/s of raw ManiSkill vs the same task through the contract and the worker pool.

    .venv/bin/python bench/env_throughput.py [--steps 200] [--sizes 64 128] [--task PickCube-v1]

Measured side by side in one run, one configuration at a time (nothing else should run):
  raw        ManiSkill env (physx_cpu, num_envs=1, rgb obs) stepped directly in this process
  contract   the same env as a TaskEnv, through ChunkVectorEnv + SerialBackend (this process)
  pool-1     ChunkVectorEnv + ProcessPoolBackend, 1 worker
  pool-2     ChunkVectorEnv + ProcessPoolBackend, 2 workers (env-steps counted over both)
Actions are uniform random in [-1, 1]; episodes are never reset inside a timed block.
All four are built first, then timed in alternating blocks (median of 5 blocks each).
"contract overhead" times ManiSkill's own step inside the contract loop: the share of time
spent in our code, immune to the load drift that makes separate timings differ by ~10% here.
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import time

import numpy as np


def interleaved(steppers: dict, steps: int, rounds: int = 5, warmup: int = 30) -> dict[str, float]:
    """Median calls/s of each stepper, timed in alternating blocks so that load drift on a
    shared machine hits every configuration alike."""
    for step in steppers.values():
        for _ in range(warmup):  # the first renders compile shaders
            step()
    times: dict[str, list[float]] = {k: [] for k in steppers}
    for _ in range(rounds):
        for name, step in steppers.items():
            t = time.perf_counter()
            for _ in range(steps):
                step()
            times[name].append(time.perf_counter() - t)
    return {k: steps / float(np.median(v)) for k, v in times.items()}


def raw_stepper(task: str, size: int):
    import torch

    from vla_envs.backends.maniskill.common import make_maniskill_env

    env = make_maniskill_env(task, 1, "physx_cpu", (size, size), "normalized_dense")
    env.reset(seed=0)
    rng = np.random.default_rng(0)

    def step():
        env.step(torch.as_tensor(rng.uniform(-1, 1, (1, 7)), dtype=torch.float32))

    return env, step


def contract_stepper(task: str, size: int, workers: int | None):
    from vla_envs.backends.maniskill.task_env import ManiSkillTaskEnv
    from vla_envs.core import ChunkVectorEnv
    from vla_envs.core.pool import ProcessPoolBackend
    from vla_envs.core.serial import SerialBackend

    fn = functools.partial(ManiSkillTaskEnv, task, "bench", (size, size))
    backend = SerialBackend([fn]) if workers is None else ProcessPoolBackend([fn] * workers)
    env = ChunkVectorEnv(backend, time_limit=10**9)
    env.reset(seed=0)
    n = env.num_envs
    rng = np.random.default_rng(0)

    def step():
        env.step(rng.uniform(-1, 1, (n, 7)).astype(np.float32))

    return env, step


def contract_overhead(env, step, steps: int) -> float:
    """Fraction of the contract's step time spent outside ManiSkill's own ``step`` (our
    conversion, validation and bookkeeping), measured in the same loop so load drift cancels."""
    sim = env.backend.envs[0]._env
    inner = [0.0]
    original = sim.step

    def timed_step(*a, **k):
        t = time.perf_counter()
        out = original(*a, **k)
        inner[0] += time.perf_counter() - t
        return out

    sim.step = timed_step
    t = time.perf_counter()
    for _ in range(steps):
        step()
    outer = time.perf_counter() - t
    sim.step = original
    return 1.0 - inner[0] / outer


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--task", default="PickCube-v1")
    p.add_argument("--steps", type=int, default=100, help="steps per timed block")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    p.add_argument("--json", default=None, help="also write results here")
    args = p.parse_args()
    import os

    results = {"task": args.task, "steps_per_block": args.steps, "cpu_count": os.cpu_count(),
               "machine": platform.machine(), "rows": []}
    print(f"{'size':>5} {'config':>9} {'env-steps/s':>12} {'ratio':>22}")
    for size in args.sizes:
        # All four alive at once and timed in alternating blocks: load drift on a shared
        # machine then hits every configuration alike, so the ratios hold even when the
        # absolute numbers move.
        envs, steppers = {}, {}
        envs["raw"], steppers["raw"] = raw_stepper(args.task, size)
        envs["contract"], steppers["contract"] = contract_stepper(args.task, size, None)
        envs["pool-1"], steppers["pool-1"] = contract_stepper(args.task, size, 1)
        envs["pool-2"], steppers["pool-2"] = contract_stepper(args.task, size, 2)
        sps = interleaved(steppers, args.steps)
        overhead = contract_overhead(envs["contract"], steppers["contract"], args.steps)
        for env in envs.values():
            env.close()
        raw, contract, pool1, pool2 = sps["raw"], sps["contract"], sps["pool-1"], 2 * sps["pool-2"]
        rows = [("raw", raw, ""), ("contract", contract, f"{contract / raw:.3f} x raw"),
                ("pool-1", pool1, f"{pool1 / raw:.3f} x raw"),
                ("pool-2", pool2, f"{pool2 / pool1:.2f} x pool-1")]
        print(f"{size:>5} contract overhead: {100 * overhead:.2f}% of step time spent outside ManiSkill's step")
        results["rows"].append({"size": size, "config": "contract-overhead-fraction", "value": overhead})
        for name, rate, ratio in rows:
            print(f"{size:>5} {name:>9} {rate:>12.1f} {ratio:>22}", flush=True)
            results["rows"].append({"size": size, "config": name, "env_steps_per_s": rate})
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
