"""``vla-envs``: list the registered envs, and roll one out to a video.

    vla-envs list
    vla-envs rollout vla/PickCube-v1 --num-envs 2 --steps 40 --video runs/demo/rollout.mp4
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

from vla_envs.errors import VlaEnvError


def cmd_list(args: argparse.Namespace) -> int:
    from vla_envs.registry import TASKS

    rows = [("id", "backend", "suite", "max_steps", "backend installed", "assets")]
    for spec in TASKS.values():
        installed = spec.backend_installed()
        assets = ("present" if spec.assets_present() else "missing") if installed else "-"
        rows.append((spec.id, spec.backend, spec.suite, str(spec.max_episode_steps),
                     "yes" if installed else f"no: pip install 'vla-rl[{spec.extra}]'", assets))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    return 0


def cmd_rollout(args: argparse.Namespace) -> int:
    import gymnasium as gym
    from tqdm import tqdm

    from vla_envs.registry import get_task
    from vla_envs.wrappers import RecordVideo

    get_task(args.env_id)  # unknown id: error with close matches before anything starts
    if args.steps < 1 or args.chunk < 1 or args.num_envs < 1:
        raise ValueError("--steps, --chunk and --num-envs must be >= 1")
    t0 = time.perf_counter()
    env = gym.make(args.env_id, num_envs=args.num_envs, image_size=args.image_size)
    if args.video:
        env = RecordVideo(env, args.video, fps=args.fps)
    rng = np.random.default_rng(args.seed)
    episodes: list[dict[str, float]] = []
    try:
        env.reset(seed=args.seed)
        make_s = time.perf_counter() - t0
        n_chunks = -(-args.steps // args.chunk)
        bar = tqdm(range(n_chunks), desc=f"rollout {args.env_id}", unit="chunk", file=sys.stderr)
        t1 = time.perf_counter()
        for _ in bar:
            if args.policy == "random":
                actions = rng.uniform(-1, 1, (args.num_envs, args.chunk, 7)).astype(np.float32)
            else:
                actions = np.zeros((args.num_envs, args.chunk, 7), np.float32)
            out = env.chunk_step(actions)
            if "episode" in out.info:
                ep, mask = out.info["episode"], out.info["_episode"]
                for i in np.flatnonzero(mask):
                    episodes.append({k: float(ep[k][i]) for k in ep})
            bar.set_postfix(reward=f"{out.rewards[out.valid].mean() if out.valid.any() else 0:.3f}",
                            episodes=len(episodes),
                            success_once=f"{np.mean([e['success_once'] for e in episodes]) if episodes else 0:.2f}")
        step_s = time.perf_counter() - t1
    finally:
        env.close()
    frames = n_chunks * args.chunk * args.num_envs
    summary = {
        "env_id": args.env_id, "num_envs": args.num_envs, "env_steps": frames,
        "env_steps_per_s": frames / step_s, "make_and_reset_s": make_s,
        "episodes": len(episodes),
        "success_once": float(np.mean([e["success_once"] for e in episodes])) if episodes else None,
        "success_at_end": float(np.mean([e["success_at_end"] for e in episodes])) if episodes else None,
        "video": str(args.video) if args.video else None,
    }
    print(json.dumps(summary, indent=2))
    if args.video:
        Path(args.video).with_suffix(".json").write_text(json.dumps(summary, indent=2))
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vla-envs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print every registered env id").set_defaults(func=cmd_list)
    r = sub.add_parser("rollout", help="roll out a scripted policy and record a video")
    r.add_argument("env_id")
    r.add_argument("--num-envs", type=int, default=2)
    r.add_argument("--steps", type=int, default=40, help="env steps per env")
    r.add_argument("--chunk", type=int, default=4, help="actions per chunk_step")
    r.add_argument("--image-size", type=int, default=128)
    r.add_argument("--policy", choices=("random", "zero"), default="random")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--video", type=Path, default=None, help="MP4 path (a .json summary is written beside it)")
    r.add_argument("--fps", type=int, default=10)
    r.set_defaults(func=cmd_rollout)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import vla_envs  # noqa: F401  (registers the ids)

    try:
        return args.func(args)
    except (VlaEnvError, ValueError) as e:
        print(f"vla-envs: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
