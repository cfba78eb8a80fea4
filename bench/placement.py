"""Training throughput of the placement modes side by side (the paper's Figure 8 on this machine).

    .venv/bin/python bench/placement.py [--envs 8] [--steps 32] [--iterations 3] [--out FILE.json]

One workload, run in each mode one after another: PPO on PutOnPlateInScene25Main-v3 (procedural
assets, low-poly Panda, 64 px) with the tiny OpenVLA-OFT model at action chunk ``--chunk`` (2 by
default: simulating 2 steps of 4 envs takes about as long as generating their chunk on one core,
the balanced case where pipelining pays; the shipped chunk 8 is simulation-bound). Throughput is
the paper's: rollout env frames / iteration wall time (rollout + update + weight sync), the mean
over ``--iterations`` after one warm-up iteration; worker start-up is not counted.

Layouts on D devices (D = 4 on a CPU machine: the paper's 8-GPU table halved, two device ids per
core; D = the GPU count on a GPU machine, a multiple of 4):

    disaggregated  env [0, D/4)   rollout [D/4, D/2)  actor [D/2, D)
    colocated      all            all                 all
    hybrid pipe=k  env [0, D/2)   rollout [D/2, D)    actor all        (k = 1, 2)
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path


def layouts(d: int) -> dict[str, list[str]]:
    r = lambda a, b: f"{a}-{b - 1}" if b - a > 1 else str(a)  # noqa: E731
    place = lambda e, ro, a: [f"cluster.component_placement.env={e}",  # noqa: E731
                              f"cluster.component_placement.rollout={ro}", f"cluster.component_placement.actor={a}"]
    return {
        "disaggregated": place(r(0, d // 4), r(d // 4, d // 2), r(d // 2, d)),
        "colocated": place("all", "all", "all"),
        "hybrid pipe=1": place(r(0, d // 2), r(d // 2, d), r(0, d)) + ["rollout.pipeline_stage_num=1"],
        "hybrid pipe=2": place(r(0, d // 2), r(d // 2, d), r(0, d)) + ["rollout.pipeline_stage_num=2"],
    }


def tiny_model(chunk: int, directory: Path) -> Path:
    from vla_trainer.checkpoint import save_model
    from vla_trainer.models import VLAPolicy, build_model

    model, tokenizer = build_model("tiny-openvla-oft", seed=0, chunk_size=chunk, value_type="chunk_level")
    save_model(VLAPolicy(model, tokenizer), directory)
    return directory


def transfer_ms(megabytes: float = 3.0, repeats: int = 20) -> dict:
    """Median ms for a uint8 batch returned by one Ray actor to reach another as an argument (the
    path of observations from env worker to rollout worker), and of the same task with 1 byte."""
    import numpy as np
    import ray

    @ray.remote(num_cpus=0)
    class Producer:
        def make(self, nbytes: int):
            return np.ones(nbytes, np.uint8)

    @ray.remote(num_cpus=0)
    class Consumer:
        def take(self, batch) -> int:
            return int(batch[-1])

    prod, cons = Producer.remote(), Consumer.remote()
    out = {}
    for label, nbytes in (("batch", int(megabytes * 2**20)), ("1 byte", 1)):
        times = []
        for _ in range(repeats + 2):
            t0 = time.perf_counter()
            ray.get(cons.take.remote(prod.make.remote(nbytes)))
            times.append(1000 * (time.perf_counter() - t0))
        out[label] = sorted(times[2:])[repeats // 2]
    for a in (prod, cons):
        ray.kill(a)
    return out


def measure(overrides: list[str], iterations: int) -> dict:
    from vla_trainer.rl.targets import compute_targets
    from vla_trainer.config import load_config
    from vla_trainer.runtime.ray_runtime import RayRuntime

    cfg = load_config("cpu_ppo_tiny_put_on_plate", overrides)
    t0 = time.perf_counter()
    rt = RayRuntime(cfg)
    setup = time.perf_counter() - t0
    rows = []
    frames = cfg.env.train.total_num_envs * cfg.rollout.steps_per_rollout
    try:
        for it in range(iterations + 1):
            t0 = time.perf_counter()
            rollout = rt.rollout(it)
            t1 = time.perf_counter()
            rt.update(rollout, compute_targets(rollout, cfg.algorithm, cfg.algorithm.group_size), it)
            t2 = time.perf_counter()
            sync = rt.sync_weights()
            wall = time.perf_counter() - t0
            rows.append({"frames_per_s": frames / wall, "iteration_s": wall, "rollout_s": t1 - t0,
                         "update_s": t2 - t1, "sync_s": sync, "generation_busy_s": rollout.timing["generation"],
                         "simulation_busy_s": rollout.timing["simulation"]})
            print(f"    iteration {it}{' (warm-up)' if it == 0 else ''}: {frames / wall:.1f} frames/s "
                  f"(rollout {t1 - t0:.2f} s [busy: generation {rollout.timing['generation']:.2f} s, simulation "
                  f"{rollout.timing['simulation']:.2f} s], update {t2 - t1:.2f} s, sync {sync:.2f} s)", flush=True)
        placement = rt.describe()
    finally:
        rt.close()
    timed = rows[1:]
    mean = {k: sum(r[k] for r in timed) / len(timed) for k in timed[0]}
    mean["frames_per_s"] = frames * len(timed) / sum(r["iteration_s"] for r in timed)
    return {"placement": placement, "setup_s": setup, **mean}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--steps", type=int, default=32, help="env steps per env per rollout")
    p.add_argument("--chunk", type=int, default=2, help="action chunk of the tiny OFT model")
    p.add_argument("--iterations", type=int, default=3, help="timed iterations per mode (after one warm-up)")
    p.add_argument("--modes", nargs="*", default=None, help="subset of the modes (default: all four)")
    p.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    args = p.parse_args()

    import ray

    from vla_trainer.runtime.placement import usable_cores, visible_gpus

    gpus = visible_gpus()
    devices = gpus if gpus else 4
    if devices % 4:
        raise SystemExit(f"the layouts need a multiple of 4 devices; this machine has {gpus} GPU(s)")
    ray.init(num_cpus=len(usable_cores()), num_gpus=gpus, include_dashboard=False, logging_level="WARNING")
    results = {}
    try:
        moved = transfer_ms()
        print(f"3 MiB actor -> actor through the object store: {moved['batch']:.1f} ms "
              f"(the same two tasks with 1 byte: {moved['1 byte']:.1f} ms)", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            model = tiny_model(args.chunk, Path(tmp) / "model")
            samples = args.envs * args.steps // args.chunk
            common = ["cluster.runtime=ray", f"cluster.num_devices={devices}", f"actor.model.model_path={model}",
                      f"env.train.total_num_envs={args.envs}", f"rollout.steps_per_rollout={args.steps}",
                      f"actor.global_batch_size={samples}", "actor.micro_batch_size=8", "algorithm.update_epoch=1",
                      "env.train.vectorization=serial"]
            for mode, extra in layouts(devices).items():
                if args.modes and mode not in args.modes:
                    continue
                print(f"{mode}:", flush=True)
                results[mode] = measure(common + extra, args.iterations)
    finally:
        ray.shutdown()

    base = results.get("disaggregated", {}).get("frames_per_s")
    print(f"\n{'mode':<15} {'frames/s':>9} {'vs disagg':>9} {'rollout s':>9} {'update s':>9} {'sync s':>7}")
    for mode, r in results.items():
        ratio = f"{r['frames_per_s'] / base:.2f}x" if base else "-"
        print(f"{mode:<15} {r['frames_per_s']:9.1f} {ratio:>9} {r['rollout_s']:9.2f} {r['update_s']:9.2f} "
              f"{r['sync_s']:7.2f}")
    if args.out:
        meta = {"machine": f"{platform.processor() or platform.machine()}, {len(usable_cores())} cores, "
                           f"{gpus} GPU(s)", "devices": devices, "args": {k: str(v) for k, v in vars(args).items()}}
        args.out.write_text(json.dumps({"meta": meta, "transfer_3MiB_ms": moved, "results": results}, indent=1))


if __name__ == "__main__":
    main()
