"""Env-steps/s of PutOnPlateInScene25Main-v3 in one process: stock vs low-poly Panda, and the
low-poly Panda at a lower physics rate.

    .venv/bin/python bench/put_on_plate_speed.py [--size 128] [--steps 40] [--sim-freq 100] [--native-render]

All envs are built first (serial vectorization, one env each, procedural pack), then timed
in alternating blocks of ``--steps`` zero-action steps (median of 5). A step is 0.2 s of
simulated time at 500 Hz (100 physics sub-steps; ``--sim-freq`` for the third env) plus one
3rd-view render with segmentation and the green screen, at ``--size`` (``native_render=False``;
``--native-render``: at the camera's 640x480, resized to ``--size``). Also reports the share of step time
spent in physics vs rendering (cProfile of the low-poly env at 500 Hz).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--sim-freq", type=int, default=100, help="physics rate of the third env (Hz)")
    p.add_argument("--native-render", action="store_true",
                   help="render at the camera's resolution and resize (the env's default) instead of at --size")
    args = p.parse_args()
    import gymnasium as gym

    import vla_envs  # noqa: F401

    configs = {"stock": dict(low_poly=False), "low-poly": dict(low_poly=True),
               "low-poly-fast": dict(low_poly=True, sim_freq=args.sim_freq)}
    # the procedural pack, as stated, whichever pack this machine has installed
    envs = {name: gym.make("PutOnPlateInScene25Main-v3", num_envs=1, image_size=args.size, vectorization="serial",
                           time_limit=10**6, assets="procedural", native_render=args.native_render, **kwargs)
            for name, kwargs in configs.items()}
    zero = np.zeros((1, 7), np.float32)
    for env in envs.values():
        env.reset(seed=0)
        for _ in range(10):
            env.step(zero)
    times = {k: [] for k in envs}
    for _ in range(5):
        for name, env in envs.items():
            t = time.perf_counter()
            for _ in range(args.steps):
                env.step(zero)
            times[name].append(time.perf_counter() - t)
    sps = {k: args.steps / float(np.median(v)) for k, v in times.items()}
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(args.steps):
        envs["low-poly"].step(zero)
    prof.disable()
    stats = pstats.Stats(prof).stats
    total = max(v[3] for v in stats.values())
    physics = sum(v[2] for k, v in stats.items() if k[2] == "<built-in method sapien.pysapien.step>")
    render = sum(v[2] for k, v in stats.items() if "take_picture" in k[2] or "get_picture" in k[2])
    for env in envs.values():
        env.close()
    print(f"image {args.size}x{args.size}, one process, env-steps/s (median of 5 blocks of {args.steps}):")
    print(f"  stock Panda     {sps['stock']:6.1f}")
    print(f"  low-poly Panda  {sps['low-poly']:6.1f}   ({sps['low-poly'] / sps['stock']:.2f} x stock)")
    print(f"  low-poly Panda at {args.sim_freq} Hz physics {sps['low-poly-fast']:6.1f}   "
          f"({sps['low-poly-fast'] / sps['low-poly']:.2f} x low-poly at 500 Hz)")
    print(f"  low-poly step time: physics {100 * physics / total:.0f} %, rendering {100 * render / total:.0f} %")


if __name__ == "__main__":
    main()
