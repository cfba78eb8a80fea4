"""Where a policy's gripper goes relative to the object, per episode (a diagnostic of the
PutOnPlate tasks; ``python -m tools.reach_report --help``).

It runs the same episodes as ``vla-eval`` (same seeds, same sampling, so the same grasps and
successes) one action at a time and reads the task's privileged state (``expert_state``: TCP
and object poses) before every action. For each episode it reports how close the gripper came
to the object sideways, how far off sideways it was at its lowest point before any grasp, and
whether the object was grasped and the task solved. Where ``grasped_once`` says *that* a policy
fails at the grasp, this says by how much its reach misses; for the episodes that grasp, how far
the carry got (how long the object was held, how high it was lifted, whether it was carried over
the plate: within the radius the task's success test allows).

Needs a task with ``expert_state`` (the PutOnPlateInScene25 family).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from vla_trainer.build import make_env
from vla_trainer.checkpoint import resolve_model_dir
from vla_envs.arguments import positive_float, positive_int
from vla_trainer.sft.start import load_init_checkpoint
from vla_trainer.config.schema import EnvSplitConfig
from vla_trainer.models import VLAModelError, VLAPolicy
from vla_trainer.rl.evaluation import round_seed

LATERAL_BINS_CM = (0, 1, 2, 3, 5, 10, float("inf"))
LIFTED_CM = 2.0  # the object rose this far while held: the lift began


@torch.no_grad()
def reach_report(env, policy, num_episodes: int, *, seed: int = 0, temperature: float = 0.6) -> list[dict]:
    """One dict per episode: ``closest_lateral_cm`` (smallest TCP-object distance in the table
    plane), ``lateral_at_lowest_cm`` and ``lowest_height_cm`` (TCP height above the object's
    origin at the lowest point before a grasp), ``grasped``, ``success``; and after the first
    grasp: ``held_steps`` (steps that began with the object held), ``max_lift_cm`` (the object's
    largest rise above its start while held, 0 when never held), ``closest_to_plate_cm`` (the
    object's smallest distance to the plate's centre in the table plane, NaN before any grasp)
    and ``carried_over_plate`` (held while within the plate's ``on_plate_radius``, the xy reach
    of the task's success test).

    ``env``: made like ``vla-eval``'s (``auto_reset=False``, episodes to the time limit).

    Raises:
        ValueError: ``num_episodes`` is not a positive multiple of ``env.num_envs``, or the env
            reports no grasp or cannot report the privileged state per env.
    """
    n = env.num_envs
    if num_episodes < 1 or num_episodes % n:
        raise ValueError(f"num_episodes={num_episodes} must be a positive multiple of num_envs={n}")
    if "grasped" not in getattr(env, "progress_flags", ()):
        raise ValueError("the env reports no grasp (progress flag 'grasped'); reach-report needs a ManiSkill task")
    if not hasattr(env.backend, "call"):
        raise ValueError(f"{type(env.backend).__name__} cannot query one env's state; use the worker pool or serial")
    generator = torch.Generator().manual_seed(seed)
    rows: list[dict] = []
    for r in range(num_episodes // n):
        obs, _ = env.reset(seed=round_seed(seed, r))
        closest = np.full(n, np.inf)
        lowest, lateral_at_lowest = np.full(n, np.inf), np.full(n, np.nan)
        grasped, success, finished = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        holding, held_steps = np.zeros(n, bool), np.zeros(n, int)
        start_z, max_lift, to_plate = np.full(n, np.nan), np.zeros(n), np.full(n, np.inf)
        over_plate = np.zeros(n, bool)
        while not finished.all():
            actions = policy.act(obs, temperature=temperature, generator=generator).actions.cpu().numpy()
            for j in range(actions.shape[1]):
                batch = env.expert_state()
                for i in np.flatnonzero(~finished):
                    state = {key: value[i] for key, value in batch.items()}
                    lateral = float(np.linalg.norm(state["tcp"][:2] - state["object"][:2]))
                    height = float(state["tcp"][2] - state["object"][2])
                    closest[i] = min(closest[i], lateral)
                    if not grasped[i] and height < lowest[i]:
                        lowest[i], lateral_at_lowest[i] = height, lateral
                    if np.isnan(start_z[i]):
                        start_z[i] = state["object"][2]
                    plate_xy = float(np.linalg.norm(state["object"][:2] - state["plate"][:2]))
                    if holding[i]:
                        held_steps[i] += 1
                        max_lift[i] = max(max_lift[i], float(state["object"][2] - start_z[i]))
                        over_plate[i] |= plate_xy <= float(state["on_plate_radius"])
                    if grasped[i]:
                        to_plate[i] = min(to_plate[i], plate_xy)
                out = env.chunk_step(actions[:, j:j + 1])
                holding = out.info["grasped"][:, 0] & ~finished
                grasped |= holding
                success |= out.info["success"][:, 0] & ~finished
                if "episode" in out.info:
                    finished |= out.info["_episode"]
                obs = out.obs
                if finished.all():
                    break
        rows += [{"closest_lateral_cm": 100 * closest[i], "lateral_at_lowest_cm": 100 * lateral_at_lowest[i],
                  "lowest_height_cm": 100 * lowest[i], "grasped": bool(grasped[i]), "success": bool(success[i]),
                  "held_steps": int(held_steps[i]), "max_lift_cm": 100 * max_lift[i],
                  "closest_to_plate_cm": 100 * to_plate[i] if np.isfinite(to_plate[i]) else float("nan"),
                  "carried_over_plate": bool(over_plate[i])}
                 for i in range(n)]
    return rows


def by_closest_lateral(rows: list[dict]) -> list[dict]:
    """Episodes, grasps and successes per band of ``closest_lateral_cm``."""
    bands = []
    for low, high in zip(LATERAL_BINS_CM, LATERAL_BINS_CM[1:]):
        sel = [r for r in rows if low <= r["closest_lateral_cm"] < high]
        bands.append({"band_cm": [low, high], "episodes": len(sel), "grasped": sum(r["grasped"] for r in sel),
                      "success": sum(r["success"] for r in sel)})
    return bands


def after_the_grasp(rows: list[dict]) -> dict:
    """How far the episodes that grasped got: counts of those whose object was lifted
    ``LIFTED_CM``, of those that were then carried over the plate, and of the successes among
    all that grasped; with the median held steps."""
    held = [r for r in rows if r["grasped"]]
    lifted = [r for r in held if r["max_lift_cm"] >= LIFTED_CM]
    over = [r for r in lifted if r["carried_over_plate"]]
    return {"grasped": len(held), "lifted": len(lifted), "over_plate": len(over),
            "success": sum(r["success"] for r in held),
            "median_held_steps": float(np.median([r["held_steps"] for r in held])) if held else None}


def markdown(rows: list[dict], header: str) -> str:
    """The per-band table, with medians of grasped and other episodes."""
    lines = [header, "", "| closest sideways approach | episodes | grasped | success |", "|---|---|---|---|"]
    for b in by_closest_lateral(rows):
        low, high = b["band_cm"]
        band = f"{low:g}-{high:g} cm" if np.isfinite(high) else f">= {low:g} cm"
        lines.append(f"| {band} | {b['episodes']} | {b['grasped']} | {b['success']} |")
    for name, sel in (("grasped", [r for r in rows if r["grasped"]]), ("not grasped", [r for r in rows if not r["grasped"]])):
        if sel:
            lines.append(f"\n{name} ({len(sel)}): median closest sideways approach "
                         f"{np.median([r['closest_lateral_cm'] for r in sel]):.1f} cm, median sideways offset at "
                         f"the lowest point {np.nanmedian([r['lateral_at_lowest_cm'] for r in sel]):.1f} cm")
    carry = after_the_grasp(rows)
    if carry["grasped"]:
        lines += ["", "| after the grasp | episodes |", "|---|---|", f"| grasped | {carry['grasped']} |",
                  f"| object lifted >= {LIFTED_CM:g} cm | {carry['lifted']} |",
                  f"| then carried over the plate | {carry['over_plate']} |",
                  f"| success (of the grasped) | {carry['success']} |",
                  f"\nthe grasped held the object a median {carry['median_held_steps']:g} steps"]
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    m = argparse.ArgumentParser(prog="python -m tools.reach_report",
                                description="how far a policy's reach misses the object and how far its carry "
                                            "gets, per episode, on vla-eval's episodes (PutOnPlate tasks)")
    m.add_argument("--checkpoint", type=Path, required=True,
                   help="model folder, training checkpoint or run folder (its latest)")
    m.add_argument("--task", default="PutOnPlateInScene25Main-v3", help="a task with expert_state and a grasp flag")
    m.add_argument("--num-episodes", type=positive_int, default=32)
    m.add_argument("--num-envs", type=positive_int, default=4)
    m.add_argument("--seed", type=int, default=0, help="as vla-eval's --seed: the same seed runs the same episodes")
    m.add_argument("--temperature", type=positive_float, default=0.6)
    m.add_argument("--env-kwargs", default="{}", help="JSON of extra gym.make arguments")
    m.add_argument("--vectorization", default="pool", choices=("pool", "serial"))
    m.add_argument("--out", type=Path, default=None, help="also write reach.md and reach.json here")
    return m


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    try:
        env_kwargs = json.loads(args.env_kwargs)
    except ValueError as e:
        print(f"error: --env-kwargs is not a JSON object: {e}", file=sys.stderr)
        return 2
    if args.num_episodes % args.num_envs:
        print(f"error: --num-episodes ({args.num_episodes}) must be a multiple of --num-envs ({args.num_envs})",
              file=sys.stderr)
        return 2
    try:
        model, tokenizer = load_init_checkpoint(args.checkpoint, flag="--checkpoint")
        policy = VLAPolicy(model, tokenizer)
        split = EnvSplitConfig(task=args.task, total_num_envs=args.num_envs, ignore_terminations=True,
                               vectorization=args.vectorization, env_kwargs=env_kwargs)
        env = make_env(split, policy.config.image_size, evaluation=True)
        try:
            rows = reach_report(env, policy, args.num_episodes, seed=args.seed, temperature=args.temperature)
        finally:
            env.close()
    except (FileNotFoundError, ValueError, KeyError, VLAModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    source = resolve_model_dir(args.checkpoint)  # the model folder read above, e.g. a run's latest checkpoint
    table = markdown(rows, f"checkpoint: {source}; {args.task}; {args.num_episodes} episodes; "
                           f"temperature {args.temperature}; seed {args.seed}")
    print(table)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "reach.md").write_text(table + "\n")
        (args.out / "reach.json").write_text(json.dumps({"checkpoint": str(source), "env_kwargs": env_kwargs,
                                                         "episodes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
