"""``vla-envs``: list the registered envs, roll one out to a video, record expert demos.

    vla-envs list
    vla-envs rollout PutOnPlateInScene25Main-v3 --policy expert --video runs/demo/rollout.mp4
    vla-envs collect-demos PutOnPlateInScene25Main-v3 --episodes 20 --out demos/put_on_plate
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path

import numpy as np

from vla_envs.arguments import int_at_least, json_object, positive_int
from vla_envs.core.backend import env_rows
from vla_envs.errors import VlaEnvError
from vla_envs.wrappers.video import close_recording, video_file


def cmd_list(args: argparse.Namespace) -> int:
    from vla_envs.registry import TASKS

    rows = [("id", "backend", "suite", "max_steps", "backend installed", "assets")]
    for spec in TASKS.values():
        installed = spec.backend_installed()
        assets = spec.assets_status() if installed else "-"
        rows.append((spec.id, spec.backend, spec.suite, str(spec.max_episode_steps),
                     "yes" if installed else f"no: pip install 'vla-rl[{spec.extra}]'", assets))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip())
    if importlib.util.find_spec("sapien") is not None:
        from vla_envs.backends.maniskill.physx import physx_library_status

        present, path = physx_library_status()
        print(f"\nPhysX GPU library (sim_backend='physx_cuda'): {'present' if present else 'missing'}: {path}"
              + ("" if present else "  (vla-envs fetch-physx)"))
    return 0


DEFAULT_STEPS = 80  # one PutOnPlate episode
PERTURBED_DIMS = [0, 1, 2, 5]  # translation and yaw; the gripper command stays the expert's


def perturb(actions: np.ndarray, std: float, rng: np.random.Generator) -> np.ndarray:
    """The actions to execute: ``actions`` ``[N, C, 7]`` plus Gaussian noise of ``std`` on
    translation and yaw, clipped to [-1, 1]. Demos record the unperturbed actions (DART: the
    states drift off the expert's path, the labels show how it recovers)."""
    if not std:
        return actions
    out = actions.copy()
    out[..., PERTURBED_DIMS] += rng.normal(0.0, std, out[..., PERTURBED_DIMS].shape)
    return np.clip(out, -1.0, 1.0).astype(np.float32)


def run_episodes(args: argparse.Namespace, recorder_folder: Path | None = None) -> dict:
    """Roll out ``args.policy`` for ``args.steps`` steps per env (or until ``args.episodes``
    episodes ended), optionally recording video and demos. Returns a summary dict (with
    ``video_error`` when the video could not be written: the rollout's numbers stand).

    With ``args.episodes``, the episodes counted (and recorded) are each env's first
    ``ceil(episodes / num_envs)``, one fewer for the last envs to make the number: which episodes count
    never depends on how long they ran, so quick successes are not favoured when episodes end at success.
    """
    import gymnasium as gym
    from tqdm import tqdm

    from vla_envs.demos import SCENE_BODIES, EpisodeRecorder, scene_poses
    from vla_envs.registry import get_task
    from vla_envs.wrappers import RecordVideo

    spec = get_task(args.env_id)  # unknown id: error with close matches before anything starts
    if args.policy == "expert" and not spec.expert:
        raise ValueError(f"{args.env_id} has no scripted expert"
                         + ("; --policy must be 'random' or 'zero'" if args.command != "collect-demos" else ""))
    action_noise = getattr(args, "action_noise", 0.0)
    if not 0.0 <= action_noise <= 1.0 or (action_noise and args.policy != "expert"):
        raise ValueError(f"--action-noise {action_noise}: must be in [0, 1], and only perturbs the scripted "
                         "expert's actions")
    expert_kwargs = getattr(args, "expert_kwargs", None) or {}
    if expert_kwargs and args.policy != "expert":
        raise ValueError("--expert-kwargs only configures the scripted expert")
    expert = None
    if args.policy == "expert":
        try:
            expert = spec.make_expert(args.num_envs, seed=args.seed, options=expert_kwargs)
        except ValueError as e:
            raise ValueError(f"--expert-kwargs: {e}") from e
    if "num_envs" in args.env_kwargs:
        raise ValueError("--env-kwargs: num_envs is set by --num-envs")
    steps = args.steps if args.steps is not None else (10**9 if args.episodes else DEFAULT_STEPS)
    rng = np.random.default_rng(args.seed)
    t0 = time.perf_counter()
    kwargs = {"image_size": args.image_size, **args.env_kwargs}
    env = gym.make(args.env_id, num_envs=args.num_envs, **kwargs)
    base = env
    if args.video:
        try:
            env = RecordVideo(env, args.video, fps=args.fps or spec.control_hz)
        except BaseException:  # its folder cannot be made: the workers go too
            base.close()
            raise
    chunk = 1 if expert is not None else args.chunk  # a closed-loop expert re-plans every step
    recorder = (EpisodeRecorder(recorder_folder, args.num_envs, args.env_id, getattr(base, "asset_pack", None),
                                only_success=getattr(args, "only_success", True), action_noise=action_noise,
                                expert_kwargs=expert_kwargs, env_kwargs=kwargs,
                                scene_bodies=SCENE_BODIES if expert is not None else ())
                if recorder_folder is not None else None)
    per_env = -(-args.episodes // args.num_envs) if args.episodes else 0
    extra = per_env * args.num_envs - args.episodes if per_env else 0
    quota = [per_env - (i >= args.num_envs - extra) for i in range(args.num_envs)] if per_env else None
    by_env: list[list[dict[str, float]]] = [[] for _ in range(args.num_envs)]  # each env's, in order
    kept = 0
    try:
        obs, info = env.reset(seed=args.seed)
        state_ids = info["state_id"]
        make_s = time.perf_counter() - t0
        n_chunks = -(-steps // chunk)
        chunks = range(n_chunks) if not args.episodes else (i for i in range(n_chunks))  # no ETA when ending on episodes
        bar = tqdm(chunks, desc=f"{args.policy} {args.env_id}", unit="chunk", file=sys.stderr)
        t1, frames = time.perf_counter(), 0
        for _ in bar:
            scene = None
            if expert is not None:
                states = env_rows(base.expert_state())
                actions = expert.act(states)[:, None, :]
                scene = scene_poses(states)
            elif args.policy == "random":
                actions = rng.uniform(-1, 1, (args.num_envs, chunk, 7)).astype(np.float32)
            else:
                actions = np.zeros((args.num_envs, chunk, 7), np.float32)
            instructions = obs["instruction"]
            out = env.chunk_step(perturb(actions, action_noise, rng))  # the recorder keeps ``actions``
            frames += int(out.valid.sum())
            if recorder is not None:
                recorder.add(obs, actions[:, 0], out.rewards[:, 0], out.info["success"][:, 0], scene)
            obs = out.obs
            if "episode" in out.info:
                ep, mask = out.info["episode"], out.info["_episode"]
                for i in np.flatnonzero(mask):
                    record = {k: float(ep[k][i]) for k in ep}
                    counted = quota is None or len(by_env[i]) < quota[i]
                    if counted:
                        by_env[i].append(record)
                    if recorder is not None and counted:
                        kept += recorder.finish(i, instructions[i], int(state_ids[i]), record)
                    elif recorder is not None:
                        recorder.discard(i)
                if expert is not None:
                    expert.reset(np.flatnonzero(mask))
            state_ids = out.info["state_id"]
            so_far = [e["success_once"] for env_episodes in by_env for e in env_episodes]
            bar.set_postfix(episodes=len(so_far), success_once=f"{np.mean(so_far) if so_far else 0:.2f}")
            if quota is not None and all(len(done) >= q for done, q in zip(by_env, quota)):
                break
            if getattr(base.unwrapped, "exhausted", False):  # enumerate_initial_states: every id has run
                break
        step_s = time.perf_counter() - t1
    finally:
        video_error = close_recording(env)  # the rollout's numbers stand: reported with it
    episodes = [e for env_episodes in by_env for e in env_episodes]
    mean = lambda k: float(np.mean([e[k] for e in episodes])) if episodes else None  # noqa: E731
    return {
        "env_id": args.env_id, "policy": args.policy, "num_envs": args.num_envs,
        "asset_pack": getattr(base, "asset_pack", None), "env_steps": frames,
        "env_steps_per_s": frames / step_s, "make_and_reset_s": make_s, "episodes": len(episodes),
        "success_once": mean("success_once"), "success_at_end": mean("success_at_end"),
        **{f"{flag}_once": mean(f"{flag}_once") for flag in getattr(base, "progress_flags", ())},
        "return": mean("return"), "length": mean("length"),
        "video": str(args.video) if args.video and not video_error else None,
        **({"video_error": video_error} if video_error else {}),
        **({"demos_kept": kept, "demo_folder": str(recorder_folder)} if recorder_folder else {}),
    }


def _short_of_episodes(summary: dict, args: argparse.Namespace) -> None:
    if args.episodes and summary["episodes"] < args.episodes:
        why = (f"within --steps {args.steps}; raise --steps, or leave it out to run until they finish"
               if args.steps is not None else "before every enumerated initial state had run")
        print(f"vla-envs: warning: {summary['episodes']} of the {args.episodes} episodes asked for finished {why}",
              file=sys.stderr)


def cmd_rollout(args: argparse.Namespace) -> int:
    summary = run_episodes(args)
    print(json.dumps(summary, indent=2))
    _short_of_episodes(summary, args)
    if "video_error" in summary:
        print(f"vla-envs: error: {summary['video_error']}", file=sys.stderr)
        return 1
    if args.video:
        Path(args.video).with_suffix(".json").write_text(json.dumps(summary, indent=2))
    return 0


def cmd_collect_demos(args: argparse.Namespace) -> int:
    from vla_envs.demos import check_new_demo_folder

    check_new_demo_folder(args.out)  # before the envs start
    args.video = None
    summary = run_episodes(args, recorder_folder=args.out)
    print(json.dumps(summary, indent=2))
    _short_of_episodes(summary, args)
    return 0


def cmd_eval_ood(args: argparse.Namespace) -> int:
    """Every PutOnPlate variant, then a table of per-variant and per-category success."""
    import copy

    from vla_envs.tasks.put_on_plate.variants import VARIANTS, ood_table

    # Every episode runs to the time limit: success_at_end then differs from success_once (an episode
    # ending at its first success has both equal)
    env_kwargs = {"ignore_terminations": True, **args.env_kwargs}
    _check_writable_folder(args.out)  # before the minutes each variant takes
    rows = []
    for env_id, variant in VARIANTS.items():
        a = copy.copy(args)
        a.env_id, a.video, a.steps, a.env_kwargs = env_id, None, 10**9, env_kwargs
        summary = run_episodes(a)
        rows.append({"env_id": env_id, "category": variant.category, "episodes": summary["episodes"],
                     "success_once": summary["success_once"], "success_at_end": summary["success_at_end"],
                     **({"grasped_once": summary["grasped_once"]} if "grasped_once" in summary else {}),
                     "asset_pack": summary["asset_pack"]})
    ends = "at the time limit" if env_kwargs["ignore_terminations"] else "at the first success or the time limit"
    averages, table = ood_table(rows, f"policy: {args.policy}; asset pack: {rows[0]['asset_pack']}; "
                                      f"{args.episodes} episodes per variant, each ending {ends}")
    print(table)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ood_eval.md").write_text(table + "\n")
    (args.out / "ood_eval.json").write_text(json.dumps({"policy": args.policy, "rows": rows, "averages": averages}, indent=2))
    return 0


def _check_writable_folder(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    probe = folder / ".write-check"
    probe.write_bytes(b"")
    probe.unlink()


def cmd_fetch_assets(args: argparse.Namespace) -> int:
    from vla_envs.tasks.put_on_plate.assets import asset_root
    from vla_envs.tasks.put_on_plate.fetch import check_official, fetch_official

    root = args.asset_dir or asset_root()
    if args.check:
        manifest = check_official(root)
        print(f"{root / 'official'}: {len(manifest['files'])} files match {manifest['repo']}@{manifest['commit']}")
        return 0
    manifest = fetch_official(root, args.repo, args.revision)
    print(f"installed {root / 'official'}: {len(manifest['files'])} files of {manifest['repo']}@{manifest['commit']}, "
          "every checksum verified")
    return 0


def cmd_fetch_physx(args: argparse.Namespace) -> int:
    from vla_envs.backends.maniskill.physx import fetch_physx

    try:
        path = fetch_physx(home=args.home, url=args.url)
    except RuntimeError as e:
        print(f"vla-envs: error: {e}; nothing was installed", file=sys.stderr)
        return 1
    print(f"installed {path} (verified: the zip's CRCs, the library's size, and that it loads where CUDA is present)")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from vla_envs.doctor import report, run_checks

    checks = run_checks()
    print(report(checks))
    missing = [c.name for c in checks if c.status == "missing"]
    if missing:
        print(f"\nmissing: {', '.join(missing)} (see fix)", file=sys.stderr)
    return 1 if missing else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="vla-envs", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="print every registered env id").set_defaults(func=cmd_list)
    r = sub.add_parser("rollout", help="roll out a scripted policy and record a video")
    c = sub.add_parser("collect-demos", help="record scripted-expert episodes for SFT (see vla_envs.demos)")
    for q in (r, c):
        q.add_argument("env_id")
        q.add_argument("--num-envs", type=positive_int, default=2)
        q.add_argument("--steps", type=positive_int, default=None,
                       help=f"env steps per env, at most (default: {DEFAULT_STEPS}; with --episodes, until they finished)")
        q.add_argument("--episodes", type=int_at_least(0), default=0, help="stop after this many finished episodes (0: no limit)")
        q.add_argument("--chunk", type=positive_int, default=4, help="actions per chunk_step (the expert re-plans every step)")
        q.add_argument("--image-size", type=positive_int, default=128)
        q.add_argument("--seed", type=int_at_least(0), default=0)
        q.add_argument("--env-kwargs", type=json_object, default="{}", help='JSON of extra gym.make arguments, e.g. \'{"low_poly": true}\'')
    r.add_argument("--policy", choices=("random", "zero", "expert"), default="random")
    r.add_argument("--video", type=video_file, default=None, help="MP4 path (a .json summary is written beside it)")
    r.add_argument("--fps", type=positive_int, default=None,
                   help="frames per second of the video (default: the task's control rate, so it plays in real time)")
    r.set_defaults(func=cmd_rollout)
    c.add_argument("--out", type=Path, required=True, help="demo folder")
    c.add_argument("--all", dest="only_success", action="store_false", help="keep failed episodes too")
    c.add_argument("--action-noise", type=float, default=0.0,
                   help="std of Gaussian noise on the executed translation and yaw actions; the demos "
                        "record the expert's own actions, so they show recoveries (default: 0)")
    c.add_argument("--expert-kwargs", type=json_object, default="{}",
                   help='JSON of scripted-expert options, e.g. \'{"max_speed": 0.3}\' (PutOnPlate: the '
                        "largest translation per step as a fraction of the controller's; default: {})")
    c.set_defaults(func=cmd_collect_demos, policy="expert")
    o = sub.add_parser("eval-ood", help="run a policy on every PutOnPlate variant; success table by category")
    o.add_argument("--policy", choices=("random", "zero", "expert"), default="expert")
    o.add_argument("--episodes", type=positive_int, default=8, help="episodes per variant")
    o.add_argument("--num-envs", type=positive_int, default=2)
    o.add_argument("--image-size", type=positive_int, default=128)
    o.add_argument("--seed", type=int_at_least(0), default=0)
    o.add_argument("--env-kwargs", type=json_object, default="{}", help="JSON of extra gym.make arguments")
    o.add_argument("--out", type=Path, default=Path("runs/eval_ood"), help="writes ood_eval.md and ood_eval.json")
    o.set_defaults(func=cmd_eval_ood, chunk=1)
    f = sub.add_parser("fetch-assets", help="download and verify the official PutOnPlate pack (needs internet)")
    f.add_argument("--repo", default="RLinf/maniskill_assets", help="hub dataset holding carrot/")
    f.add_argument("--revision", default="main", help="branch, tag or commit of that dataset")
    f.add_argument("--asset-dir", type=Path, default=None, help="default: $VLA_ENVS_ASSET_DIR or ~/.vla_envs/assets")
    f.add_argument("--check", action="store_true", help="only verify the installed pack against FETCHED.json (offline)")
    f.set_defaults(func=cmd_fetch_assets)
    x = sub.add_parser("fetch-physx", help="download and verify SAPIEN's PhysX GPU library (needs internet)")
    x.add_argument("--home", type=Path, default=None,
                   help="install under DIR/.sapien/physx (a cluster's shared disk; link it to ~/.sapien/physx)")
    x.add_argument("--url", default=None, help="download from here instead of the sapien-sim GitHub release")
    x.set_defaults(func=cmd_fetch_physx)
    sub.add_parser("doctor", help="check rendering, CUDA, PhysX, assets and robot extras; print the fixes"
                   ).set_defaults(func=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    import vla_envs  # noqa: F401  (registers the ids)

    try:
        return args.func(args)
    except (VlaEnvError, ValueError, json.JSONDecodeError, FileExistsError) as e:
        print(f"vla-envs: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a path that cannot be written (--video, --out): named, no traceback
        print(f"vla-envs: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
