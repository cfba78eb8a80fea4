"""``vla-eval``: success of a trained policy, on one task or on every PutOnPlate OOD variant.

    vla-eval --checkpoint runs/cpu_ppo_tiny_put_on_plate                  # the run's latest checkpoint
    vla-eval --checkpoint runs/sft/tiny --task PutOnPlateInScene25Main-v3 --num-episodes 32
    vla-eval --checkpoint runs/ppo --ood --num-episodes 8 --out runs/ppo/ood   # the OOD table
    vla-eval --checkpoint runs/ppo --video runs/ppo/eval.mp4
    vla-eval --checkpoint runs/ppo --expert-start-phase lift   # success once grasped (PutOnPlate diagnostic)
    vla-eval --checkpoint runs/libero --libero all --num-envs 8      # LIBERO: per suite + average

LIBERO follows the OpenVLA / OpenVLA-OFT protocol: every task of a suite from its official
initial states (``--trials-per-task``, 50 by default), each exactly once, episodes ending at
success or at the suite's step limit, 256 px unless the model needs another size.

Each env runs exactly one episode per round (no auto-reset double counting); episodes start from
initial states drawn with seeds that training never uses, from the task's whole set: on a task a run
trained on, a long run may have met a few of them (PutOnPlate's 802,816 states: about 8 of 128
after the paper's 1000-iteration GRPO recipe). States no run trained on are a held-out twin's
(``PutOnPlateInScene25EasyHeldOut-v3`` beside ``Easy``) or an OOD variant's. Both success notions
are reported, labelled: ``success_once`` (the task was solved at some step) and ``success_at_end``
(solved at the last step). Tasks that report sub-goals add partial success, e.g. ``grasped_once``
(the object was held at some step) on the ManiSkill tasks, as SimplerEnv reports grasp rates beside
success.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from vla_envs.arguments import int_at_least, json_object, positive_float, positive_int
from vla_envs.wrappers.video import video_file


def evaluate_tasks(policy, tasks: list[str], args, asset_meta: dict) -> list[dict]:
    from vla_trainer.config.schema import EnvSplitConfig
    from vla_trainer.rl.evaluation import evaluate_policy, wilson_interval
    from vla_trainer.build import make_env
    from vla_envs.registry import get_task
    from vla_envs.wrappers import RecordVideo

    rows = []
    for i, task in enumerate(tasks):
        split = EnvSplitConfig(task=task, total_num_envs=args.num_envs, ignore_terminations=not args.terminate,
                               max_episode_steps=args.max_episode_steps, vectorization=args.vectorization,
                               env_kwargs=args.env_kwargs)
        env = make_env(split, policy.config.image_size, evaluation=True, expert_start_phase=args.expert_start_phase)
        asset_meta.setdefault("asset_pack", getattr(env, "asset_pack", None))
        run_env = RecordVideo(env, args.video, fps=get_task(task).control_hz) if (args.video and i == 0) else env
        episodes: dict = {}
        try:
            res = evaluate_policy(run_env, policy, args.num_episodes, seed=args.seed, greedy=args.greedy,
                                  temperature=args.temperature, top_k=args.top_k or None,
                                  execute_steps=args.execute_steps, episodes=episodes)
        finally:
            close_recording(run_env, asset_meta.setdefault("video_errors", []))
        n = res["num_episodes"]
        ci = wilson_interval(round(res["success_once"] * n), n)
        rows.append({"env_id": task, **res, "success_once_ci95": list(ci), "asset_pack": getattr(env, "asset_pack", None),
                     "env_kwargs": args.env_kwargs, "terminate": args.terminate,
                     "max_episode_steps": args.max_episode_steps, "expert_start_phase": args.expert_start_phase,
                     "episodes": episodes})
        grasped = f"  grasped_once {res['grasped_once']:.3f}" if "grasped_once" in res else ""
        print(f"{task}: success_once {res['success_once']:.3f} (95 % CI {ci[0]:.3f}-{ci[1]:.3f})  "
              f"success_at_end {res['success_at_end']:.3f}{grasped}  ({n} episodes"
              + (f"; {res['crashed_episodes']} lost to simulator crashes, not counted" if "crashed_episodes" in res else "")
              + ")", flush=True)
    return rows


def close_recording(env, video_errors: list[str]) -> None:
    """Close ``env``; a video it could not write is named and listed in ``video_errors`` (the
    evaluation's numbers stand: they are reported, and the exit status says the video failed)."""
    from vla_envs.wrappers.video import close_recording as close

    if (error := close(env)) is not None:
        print(f"error: {error}; the evaluation's results are reported without it", file=sys.stderr)
        video_errors.append(error)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="vla-eval", description=__doc__.splitlines()[0])
    p.add_argument("--checkpoint", type=Path, required=True,
                   help="model folder, training checkpoint folder or run folder (latest checkpoint)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--task", default=None,
                   help="env id (default: --env-from's evaluation task, else PutOnPlateInScene25Main-v3)")
    g.add_argument("--ood", action="store_true", help="every PutOnPlateInScene25 variant, with category averages")
    g.add_argument("--libero", default=None, metavar="SUITES",
                   help="LIBERO suites, comma-separated, or 'all' (the five of LIBERO-130): per-suite success")
    p.add_argument("--trials-per-task", type=positive_int, default=None,
                   help="LIBERO: official initial states per task (default: 50)")
    p.add_argument("--num-envs", type=positive_int, default=None,
                   help="envs stepped together (default: --env-from's env.eval.total_num_envs, else 4)")
    p.add_argument("--num-episodes", type=positive_int, default=None,
                   help="per task; a multiple of --num-envs (default: --env-from's env.eval.num_episodes, else 16; "
                        "LIBERO: --trials-per-task)")
    p.add_argument("--greedy", action=argparse.BooleanOptionalAction, default=None,
                   help="most likely action instead of sampling (default: --env-from's use_greedy, else no)")
    p.add_argument("--temperature", type=positive_float, default=None,
                   help="sampling temperature (default: --env-from's temperature_eval, else 0.6)")
    p.add_argument("--top-k", type=int_at_least(0), default=None,
                   help="top-k sampling, 0: off (default: --env-from's top_k, else 0)")
    p.add_argument("--unnorm-key", default=None,
                   help="which of the model's action statistics to un-normalise with, for a model that holds "
                        "several (default: the training checkpoint's or --env-from's actor.model.unnorm_key)")
    p.add_argument("--execute-steps", type=positive_int, default=None, metavar="K",
                   help="execute the first K actions of each predicted chunk, then re-plan from a new "
                        "observation (default: the whole chunk, as the policy was trained)")
    p.add_argument("--terminate", action=argparse.BooleanOptionalAction, default=None,
                   help="end episodes at success (default: --env-from's ignore_terminations, else run to the time "
                        "limit, so success_at_end is meaningful)")
    p.add_argument("--env-kwargs", type=json_object, default="{}", help="JSON of extra gym.make arguments, e.g. '{\"low_poly\": true}'")
    p.add_argument("--env-from", default=None, metavar="RECIPE",
                   help="evaluate as a training recipe's evaluation does (a shipped recipe name or a YAML path): its "
                        "env.eval task, env_kwargs, episode end and step limit, and its evaluation sampling "
                        "(temperature_eval, top_k, use_greedy); the options above change them")
    p.add_argument("--vectorization", default="pool", choices=("pool", "serial"))
    p.add_argument("--seed", type=int, default=None, help="(default: --env-from's actor.seed, else 0)")
    p.add_argument("--video", type=video_file, default=None,
                   help="write a tiled video of the (first) task's or LIBERO suite's episodes")
    p.add_argument("--out", type=Path, default=None, help="folder for eval.json and eval.md")
    p.add_argument("--baseline", type=Path, default=None, metavar="EVAL",
                   help="another policy's evaluation of the same task (its --out folder or eval.json): print "
                        "each metric's change and a Fisher exact test of the success counts; evaluate both with "
                        "the same --seed and --num-envs so they run the same initial states (the output says "
                        "whether they did)")
    p.add_argument("--expert-start-phase", default=None, metavar="PHASE",
                   help="PutOnPlate diagnostic: start every episode where the scripted expert enters PHASE, "
                        "e.g. lift (just grasped), carry (lifted), lower (over the plate): success from there, "
                        "which is not the task's success rate")
    args = p.parse_args(argv)
    if args.expert_start_phase is not None:
        from vla_envs.tasks.put_on_plate.expert import PHASES

        if args.expert_start_phase not in PHASES[1:]:
            p.error(f"--expert-start-phase {args.expert_start_phase!r}: one of the scripted expert's phases "
                    f"after the start: {', '.join(PHASES[1:])}")
        if args.libero is not None or args.ood:
            p.error("--expert-start-phase is for one PutOnPlate task (--task), not --ood or --libero")

    if args.libero is not None:  # the OpenVLA protocol fixes what LIBERO runs: say so rather than ignore
        if args.num_episodes is not None:
            p.error("--num-episodes is for --task and --ood; LIBERO runs every task's first --trials-per-task "
                    "official initial states")
        if args.terminate is not None:
            p.error("--terminate is for --task and --ood; LIBERO episodes always end at success (the OpenVLA protocol)")
        args.trials_per_task = 50 if args.trials_per_task is None else args.trials_per_task
    else:
        if args.trials_per_task is not None:
            p.error("--trials-per-task is for --libero; --task and --ood take --num-episodes")
    if args.out is not None and (why := unwritable_folder(args.out)):
        p.error(f"--out {args.out}: {why}; give a folder this user can write (eval.json and eval.md go into it)")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        resolve_env(args)
    except ValueError as e:
        print(f"error: --env-from {args.env_from}: {e}", file=sys.stderr)
        return 2
    baseline = None
    if args.baseline is not None:
        path = args.baseline / "eval.json" if args.baseline.is_dir() else args.baseline
        try:
            baseline = json.loads(path.read_text())["rows"]
        except (OSError, ValueError, KeyError) as e:
            print(f"error: --baseline {args.baseline}: not a vla-eval result (eval.json with rows): {e}",
                  file=sys.stderr)
            return 2
        if args.ood or args.libero is not None:
            print("error: --baseline compares one task's evaluations (--task), not --ood or --libero", file=sys.stderr)
            return 2
    if args.libero is None and not args.ood:
        import vla_envs  # noqa: F401  (registers the ids)
        from vla_envs.errors import VlaEnvError
        from vla_envs.registry import get_task

        try:
            get_task(args.task)  # before the model loads: an unknown id with its close matches
        except VlaEnvError as e:
            print(f"error: --task: {e}", file=sys.stderr)
            return 2
    if args.libero is None and args.num_episodes % args.num_envs:
        print(f"error: --num-episodes ({args.num_episodes}) must be a positive multiple of --num-envs "
              f"({args.num_envs})", file=sys.stderr)
        return 2
    from vla_envs.tasks.put_on_plate.variants import VARIANTS, ood_table
    from vla_trainer.build import load_model
    from vla_trainer.rl.evaluation import check_execute_steps
    from vla_trainer.models import VLAModelError, VLAPolicy

    if args.libero is not None:
        return libero_main(args)

    try:
        model, tokenizer, model_dir = load_model(args.checkpoint)
        policy = VLAPolicy(model, tokenizer, unnorm_key=unnorm_key(args, model_dir, model))
        check_execute_steps(args.execute_steps, policy.chunk_size)
        tasks = list(VARIANTS) if args.ood else [args.task]
        meta: dict = {}
        rows = evaluate_tasks(policy, tasks, args, meta)
    except (FileNotFoundError, VLAModelError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mode = sampling_mode(args)
    header = (f"checkpoint: {model_dir}; asset pack: {meta.get('asset_pack')}; {args.num_episodes} episodes per task; "
              f"{mode}; seed {args.seed}")
    if args.expert_start_phase:
        header += (f"; every episode starts where the scripted expert enters its {args.expert_start_phase!r} "
                   f"phase (not the task's success rate)")
    for r in rows:
        r["category"] = VARIANTS[r["env_id"]].category if r["env_id"] in VARIANTS else "task"
    averages, table = ood_table(rows, header)
    status = report(args.out, table, {"checkpoint": str(model_dir), "rows": rows, "averages": averages,
                                      "sampling": mode, "env_kwargs": args.env_kwargs,
                                      "expert_start_phase": args.expert_start_phase,
                                      **({"video_error": meta["video_errors"]} if meta.get("video_errors") else {})})
    status = status or (1 if meta.get("video_errors") else 0)
    if baseline is not None:
        from vla_trainer.rl.evaluation import compare_to_baseline

        match = [b for b in baseline if b.get("env_id") == rows[0]["env_id"]]
        if not match:
            print(f"error: --baseline {args.baseline} holds no evaluation of {rows[0]['env_id']}", file=sys.stderr)
            return 2
        print(f"\nagainst the baseline {args.baseline}:")
        print("\n".join(compare_to_baseline(match[0], rows[0])))
    return status


def resolve_env(args: argparse.Namespace) -> None:
    """Fills what the command line left open from ``--env-from``'s recipe, as its run evaluated while
    training (``env.eval``: task, env_kwargs, episode end, step limit, envs and episodes;
    ``algorithm.sampling_params``: temperature_eval, top_k, use_greedy; ``actor.seed``, which with the
    envs fixes the initial states; ``actor.model.unnorm_key``), else from the defaults of a recipe's
    evaluation. The command line's own values take precedence."""
    from vla_trainer.config.schema import EnvSplitConfig, SamplingParams

    split, sampling, args.recipe_unnorm_key = EnvSplitConfig(ignore_terminations=True), SamplingParams(), None
    seed = 0
    if args.env_from is not None:
        from vla_trainer.config.loading import load_recipe
        from vla_trainer.config.schema import TrainConfig

        # the recipe as written, not validated as a run: a paper recipe leaves the model for its run to name
        cfg = load_recipe(TrainConfig, args.env_from)  # a ConfigError is a ValueError
        split, sampling, seed = cfg.env.eval, cfg.algorithm.sampling_params, cfg.actor.seed
        args.recipe_unnorm_key = cfg.actor.model.unnorm_key
    args.seed = seed if args.seed is None else args.seed
    args.num_envs = split.total_num_envs if args.num_envs is None else args.num_envs
    if getattr(args, "libero", None) is None and args.num_episodes is None:
        args.num_episodes = split.num_episodes
    if args.task is None:
        args.task = split.task
    args.env_kwargs = {**split.env_kwargs, **args.env_kwargs}
    args.terminate = not split.ignore_terminations if args.terminate is None else args.terminate
    args.max_episode_steps = split.max_episode_steps
    args.greedy = sampling.use_greedy if args.greedy is None else args.greedy
    args.temperature = sampling.temperature_eval if args.temperature is None else args.temperature
    args.top_k = sampling.top_k if args.top_k is None else args.top_k


def unnorm_key(args: argparse.Namespace, model_dir: Path, model) -> str | None:
    """``--unnorm-key``, else the training checkpoint's ``actor.model.unnorm_key`` (its config.yaml
    beside ``model/``), else ``--env-from``'s when the model holds that set (the recipe may be for
    another model); None lets a model with one statistics set use it."""
    from vla_trainer.checkpoint import recorded_unnorm_key

    if args.unnorm_key is not None:
        return args.unnorm_key
    if (recorded := recorded_unnorm_key(model_dir)) is not None:
        return recorded
    held = getattr(model.config, "norm_stats", None) or {}
    return args.recipe_unnorm_key if args.recipe_unnorm_key in held else None


def sampling_mode(args: argparse.Namespace) -> str:
    """How actions were chosen, for the table's header and eval.json."""
    mode = "greedy" if args.greedy else (f"temperature {args.temperature}"
                                         + (f", top-k {args.top_k}" if args.top_k else ""))
    return mode if args.execute_steps is None else f"{mode}, re-planning every {args.execute_steps} actions"


def unwritable_folder(out: Path) -> str | None:
    """Why the folder ``out`` cannot be written (made where it does not exist yet), or None: checked
    before the evaluation runs, so that its results are not lost at the end."""
    existing = out
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return "is a file" if existing == out else f"{existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def report(out: Path | None, table: str, payload: dict) -> int:
    """Prints the table; with ``--out`` also writes it as ``eval.md`` and ``payload`` as ``eval.json``.
    Returns the exit status: 1 when they could not be written (the table is printed either way)."""
    print(table)
    if out:
        try:
            out.mkdir(parents=True, exist_ok=True)
            (out / "eval.md").write_text(table + "\n")
            (out / "eval.json").write_text(json.dumps(payload, indent=1))
        except OSError as e:
            print(f"error: --out {out}: the results could not be written ({e.strerror or e}); the table above "
                  "is all there is", file=sys.stderr)
            return 1
    return 0


def libero_suites(spec: str) -> list[str]:
    from vla_envs.backends.libero.suites import SUITES

    suites = list(SUITES) if spec == "all" else [x.strip() for x in spec.split(",") if x.strip()]
    bad = [x for x in suites if x not in SUITES]
    if bad or not suites:
        raise ValueError(f"--libero {spec!r}: unknown suite(s) {bad}; valid: all, {', '.join(SUITES)}")
    return suites


def libero_main(args) -> int:
    """Per-suite success over every task's first ``--trials-per-task`` official initial states."""
    import gymnasium as gym
    import numpy as np

    import vla_envs  # noqa: F401
    from vla_envs.backends.libero.suites import INIT_STATES_PER_TASK, suite_tasks
    from vla_envs.registry import get_task
    from vla_envs.wrappers import RecordVideo
    from vla_trainer.build import load_model
    from vla_trainer.rl.evaluation import check_execute_steps, evaluate_initial_states
    from vla_trainer.models import VLAModelError, VLAPolicy

    try:
        suites = libero_suites(args.libero)
        if not 1 <= args.trials_per_task <= INIT_STATES_PER_TASK:
            raise ValueError(f"--trials-per-task must be in 1..{INIT_STATES_PER_TASK}, got {args.trials_per_task}")
        model, tokenizer, model_dir = load_model(args.checkpoint)
        policy = VLAPolicy(model, tokenizer, unnorm_key=unnorm_key(args, model_dir, model))
        check_execute_steps(args.execute_steps, policy.chunk_size)
        kwargs = {"image_size": policy.config.image_size, **args.env_kwargs, "evaluation": True}
        rows, video_errors = [], []
        for suite_index, suite in enumerate(suites):
            tasks = suite_tasks(suite)
            ids = [t * INIT_STATES_PER_TASK + i for t in range(len(tasks)) for i in range(args.trials_per_task)]
            env = gym.make(suite, num_envs=min(args.num_envs, len(ids)), auto_reset=True,
                           enumerate_initial_states=ids, vectorization=args.vectorization, **kwargs)
            run_env = RecordVideo(env, args.video, fps=get_task(suite).control_hz) if (args.video and suite_index == 0) else env
            try:
                res = evaluate_initial_states(run_env, policy, seed=args.seed, greedy=args.greedy,
                                              temperature=args.temperature, top_k=args.top_k or None,
                                              execute_steps=args.execute_steps)
            finally:
                close_recording(run_env, video_errors)
            ran = {i: r for i, r in res.items() if not r["crashed"]}  # a simulator crash is no policy failure
            if not ran:
                raise ValueError(f"{suite}: every episode ended by a simulator crash; nothing to report")
            per_task = {}
            for t, task in enumerate(tasks):
                first = t * INIT_STATES_PER_TASK
                done = [ran[k]["success_once"] for k in range(first, first + args.trials_per_task) if k in ran]
                per_task[task.language] = float(np.mean(done)) if done else None
            rows.append({"suite": suite, "success": float(np.mean([r["success_once"] for r in ran.values()])),
                         "episodes": len(ran), "crashed_episodes": len(res) - len(ran), "per_task": per_task})
            lost = f"; {len(res) - len(ran)} lost to simulator crashes, not counted" if len(res) > len(ran) else ""
            print(f"{suite}: success {rows[-1]['success']:.3f} ({len(ran)} episodes{lost})", flush=True)
    except (FileNotFoundError, VLAModelError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    mode = sampling_mode(args)
    lines = [f"checkpoint: {model_dir}; {args.trials_per_task} official initial states per task; {mode}", "",
             "| suite | success | episodes |", "|---|---|---|"]
    lines += [f"| {r['suite']} | {100 * r['success']:.2f} % | {r['episodes']} |" for r in rows]
    average = float(np.mean([r["success"] for r in rows]))
    lines.append(f"| **average of the suites** | {100 * average:.2f} % | {sum(r['episodes'] for r in rows)} |")
    status = report(args.out, "\n".join(lines), {"checkpoint": str(model_dir), "suites": rows, "average": average,
                                                 "sampling": mode, **({"video_error": video_errors} if video_errors else {})})
    return status or (1 if video_errors else 0)


if __name__ == "__main__":
    sys.exit(main())
