"""LIBERO env-steps/s: our worker pool vs LIBERO's own ``SubprocVectorEnv``, side by side.

    .venv/bin/python bench/libero_throughput.py [--steps 20] [--blocks 3] [--json FILE]

Same task (libero_spatial task 0, official init state 0 in every env), both cameras (agent view
and wrist), zero actions, 1 and 2 workers, 128 and 256 px. Each configuration is built, reset,
and timed over ``--blocks`` blocks of ``--steps`` steps per env (median block); configurations
alternate so host-load drift hits all alike. Also our pool with ``fast_render`` (MSAA off; a
training-only option). Env-steps/s counts the steps of every worker. ``--threads 1`` gives every
worker of both implementations one render thread, so 1 vs 2 workers is 1 vs 2 cores.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import io
import json
import os
import statistics
import time

import numpy as np


def _libero_env(bddl: str, size: int):
    from libero.libero.envs import OffScreenRenderEnv

    with contextlib.redirect_stdout(io.StringIO()):
        return OffScreenRenderEnv(bddl_file_name=bddl, camera_heights=size, camera_widths=size, hard_reset=False)


class Theirs:
    """LIBERO's ``SubprocVectorEnv`` (pickled observations through pipes)."""

    def __init__(self, workers: int, size: int):
        from libero.libero.envs import SubprocVectorEnv

        from vla_envs.backends.libero.suites import init_states, suite_tasks

        task = suite_tasks("libero_spatial")[0]
        self.n = workers
        self.env = SubprocVectorEnv([functools.partial(_libero_env, task.bddl_file, size)] * workers)
        self.env.reset()
        self.env.set_init_state(np.stack([init_states(task)[0]] * workers))

    def steps(self, k: int) -> None:
        for _ in range(k):
            self.env.step(np.zeros((self.n, 7)))

    def close(self) -> None:
        self.env.close()


class Ours:
    """``gym.make("libero_spatial")``: ``ChunkVectorEnv`` over our pool (shared-memory observations)."""

    def __init__(self, workers: int, size: int, fast_render: bool = False):
        import gymnasium as gym

        import vla_envs  # noqa: F401

        self.n = workers
        self.env = gym.make("libero_spatial", num_envs=workers, image_size=size, fast_render=fast_render,
                            native_render=False, settle_steps=0, time_limit=10**6, auto_reset=False)  # at `size`
        self.env.reset(options={"state_ids": np.zeros(workers, np.int64)})

    def steps(self, k: int) -> None:
        self.env.chunk_step(np.zeros((self.n, k, 7), np.float32))

    def close(self) -> None:
        self.env.close()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--blocks", type=int, default=3)
    p.add_argument("--json", default=None)
    p.add_argument("--threads", type=int, default=None,
                   help="render/math threads per worker for both implementations (LP_NUM_THREADS, "
                        "OMP_NUM_THREADS); default: ours gives each worker cores // workers, LIBERO's the library default")
    args = p.parse_args()
    if args.threads is not None:
        for var in ("LP_NUM_THREADS", "OMP_NUM_THREADS"):
            os.environ[var] = str(args.threads)  # workers inherit it; our pool keeps a value the user set
    from vla_envs.backends.libero.rendering import ensure_gl

    print(f"headless GL: {ensure_gl()}", flush=True)
    rows = []
    for size in (128, 256):
        configs = {f"LIBERO SubprocVectorEnv, {w} worker(s)": functools.partial(Theirs, w, size) for w in (1, 2)}
        configs.update({f"ours (pool), {w} worker(s)": functools.partial(Ours, w, size) for w in (1, 2)})
        configs["ours (pool), 2 worker(s), fast_render"] = functools.partial(Ours, 2, size, True)
        envs = {}
        try:
            for name, make in configs.items():
                envs[name] = make()
                envs[name].steps(3)  # warm-up: first renders compile shaders
            times = {name: [] for name in envs}
            for _ in range(args.blocks):
                for name, env in envs.items():
                    t0 = time.perf_counter()
                    env.steps(args.steps)
                    times[name].append(time.perf_counter() - t0)
        finally:
            for env in envs.values():
                env.close()
        for name, ts in times.items():
            rate = envs[name].n * args.steps / statistics.median(ts)
            rows.append({"size": size, "config": name, "env_steps_per_s": rate})
            print(f"{size} px  {name:<42} {rate:6.2f} env-steps/s", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
