"""``vla-train``: training stages of a VLA policy.

    vla-train --config maniskill_ppo_openvlaoft actor.model.model_path=runs/sft/tiny runner.max_epochs=50
    vla-train recipes                        # the shipped recipes
    vla-train sft --demos demos/put_on_plate --preset tiny-openvla-oft --steps 500 \\
        --batch-size 16 --lr 1e-4 --out runs/sft/tiny --seed 0
    vla-train pretrain-vision --demos demos/put_on_plate --steps 1000 --out runs/vision
    vla-train sft --demos demos/put_on_plate --init-from runs/vision ...   # then behaviour cloning
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from pathlib import Path

from vla_envs.arguments import json_object, positive_float, positive_int


UNNORM_KEY_HELP = ("the checkpoint's action statistics to act with (default: the ones its training run used, "
                   "else the model's only set)")


def training_policy(args: argparse.Namespace):
    """The policy a training stage starts from (``--init-from`` or a new ``--preset`` model), or
    a message saying why it cannot be built."""
    from vla_trainer.sft.start import starting_policy

    try:
        return starting_policy(args.demos, preset=args.preset, init_from=args.init_from, seed=args.seed,
                               slot_embeddings=args.slot_embeddings, patch_positions=args.patch_positions,
                               layout_token=args.layout_token, proprio=getattr(args, "proprio", False),
                               unnorm_key=args.unnorm_key)
    except (ValueError, FileNotFoundError, OSError) as e:
        return str(e)


def run_stage(args: argparse.Namespace, train) -> int:
    """Builds the policy, runs ``train(policy)`` and prints its metrics; exit 2 with a message on bad input."""
    from vla_trainer.checkpoint import check_model_out_dir
    from vla_trainer.models import VLAModelError

    try:
        check_model_out_dir(args.out)
    except FileExistsError as e:
        print(f"error: --out {e}", file=sys.stderr)
        return 2
    policy = training_policy(args)
    if isinstance(policy, str):
        print(f"error: {policy}", file=sys.stderr)
        return 2
    try:
        metrics = train(policy)
    except (FileNotFoundError, ValueError, KeyError, VLAModelError) as e:
        print(f"error: {' '.join(map(str, args.demos))}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(metrics, indent=1))
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    from vla_trainer.config.sft import SFTConfig
    from vla_trainer.sft.train import train_sft

    try:  # every setting checked before the policy is built or a demo read
        cfg = SFTConfig(**{name: getattr(args, name) for name in SFTConfig.field_names() if hasattr(args, name)})
    except ValueError as e:
        flag = str(e).split("=", 1)[0]
        print(f"error: --{flag.replace('_', '-')}: {e}", file=sys.stderr)
        return 2
    return run_stage(args, lambda policy: train_sft(policy, args.demos, cfg, out_dir=args.out))


def cmd_pretrain_vision(args: argparse.Namespace) -> int:
    from vla_trainer.sft.vision import pretrain_vision

    return run_stage(args, lambda policy: pretrain_vision(
        policy, args.demos, steps=args.steps, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
        eval_every=args.eval_every, out_dir=args.out))


ACTION_DIM_NAMES = ("x", "y", "z", "roll", "pitch", "yaw", "gripper")


def cmd_warm_start(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_trainer.config import ConfigError
    from vla_trainer.config.warm_start import load_warm_start, warm_start_yaml
    from vla_trainer.models import VLAModelError
    from vla_trainer.checkpoint import check_model_out_dir
    from vla_trainer.sft.warm_start import make_warm_start, project_path, publish_warm_start

    try:
        cfg = load_warm_start(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(warm_start_yaml(cfg), end="")
        return 0
    if args.out is None:
        print("error: --out DIR: the folder the stages write (a run started again goes on where it stopped)",
              file=sys.stderr)
        return 2
    if args.publish is not None and not args.publish and cfg.publish_to is None:
        print(f"error: --publish: recipe {args.config} names no publish_to; give the folder: --publish DIR",
              file=sys.stderr)
        return 2
    try:
        if args.publish is not None:  # before hours of stages: a folder that would lose something is refused now
            check_model_out_dir(args.publish or project_path(cfg.publish_to))
        last = make_warm_start(cfg, args.out)
        print(f"warm start: {last}")
        if args.publish is not None:
            command = " ".join(["vla-train warm-start --config", str(args.config), *args.overrides])
            print(f"published {publish_warm_start(args.out, args.publish or None, command=command)}")
    except (FileNotFoundError, FileExistsError, ValueError, KeyError, VLAModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as e:
        print(f"error: the demo recording failed (exit {e.returncode}); its output is above", file=sys.stderr)
        return 1
    return 0


def cmd_publish_warm_start(args: argparse.Namespace) -> int:
    from vla_trainer.sft.warm_start import publish_warm_start

    try:
        out = publish_warm_start(args.run, args.to)
    except FileExistsError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: --run {args.run}: not a whole warm-start folder ({type(e).__name__}: {e})", file=sys.stderr)
        return 2
    print(f"published {out}")
    return 0


def cmd_sft_report(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_trainer.models import VLAModelError
    from vla_trainer.sft.start import check_demo_folders, checkpoint_policy
    from vla_trainer.sft.train import action_error_by_step

    try:
        steps = tuple(int(t) for t in args.steps.split(","))
        if min(steps) < 0:
            raise ValueError
    except ValueError:
        print(f"error: --steps {args.steps!r}: give episode steps >= 0, comma-separated, e.g. 0,1,3",
              file=sys.stderr)
        return 2
    try:
        check_demo_folders(args.demos)
        policy = checkpoint_policy(args.checkpoint, unnorm_key=args.unnorm_key)
        report = action_error_by_step(policy, args.demos, steps)
    except (FileNotFoundError, ValueError, KeyError, VLAModelError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not report:
        print(f"error: --steps {args.steps}: no demo episode is that long", file=sys.stderr)
        return 2
    names = ACTION_DIM_NAMES if len(next(iter(report.values()))["zero"]) == len(ACTION_DIM_NAMES) else None
    print("greedy |error| of the chunk's first action at episode step t, against the zero action's")
    for t, row in report.items():
        dims = names or range(len(row["zero"]))
        cells = "  ".join(f"{d} {p:.2f}/{z:.2f}" for d, p, z in zip(dims, row["policy"], row["zero"]))
        print(f"t={t:<3d} ({row['episodes']} episodes)  {cells}")
    if args.json:
        try:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps({str(t): row for t, row in report.items()}, indent=1))
        except OSError as e:
            print(f"error: --json {args.json}: cannot be written ({e.strerror}); the table above is the report",
                  file=sys.stderr)
            return 1
    return 0


def cmd_collect_corrections(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_envs.demos import check_new_demo_folder
    from vla_envs.errors import VlaEnvError
    from vla_trainer.models import VLAModelError
    from vla_trainer.sft.corrections import collect_corrections
    from vla_trainer.sft.start import checkpoint_policy

    try:
        handover = [int(h) for h in args.handover_steps.split(",")]
        grasp_delays = [int(d) for d in args.handover_after_grasp.split(",")] if args.handover_after_grasp else []
        env_kwargs = args.env_kwargs
    except ValueError as e:
        print(f"error: --handover-steps {args.handover_steps!r} / --handover-after-grasp "
              f"{args.handover_after_grasp!r} (comma-separated env steps, e.g. 8,16) or "
              f"--env-kwargs (JSON object): {e}", file=sys.stderr)
        return 2
    try:
        check_new_demo_folder(args.out)
    except FileExistsError as e:
        print(f"error: --out: {e}", file=sys.stderr)
        return 2
    try:
        policy = checkpoint_policy(args.checkpoint, unnorm_key=args.unnorm_key)
        env_id, env_kwargs = corrections_env(args.checkpoint, args.env_id, env_kwargs)
        print(f"acting in {env_id} with {env_kwargs}", file=sys.stderr, flush=True)  # stdout: the summary
        summary = collect_corrections(policy, env_id, args.out, args.episodes,
                                      handover_steps=handover, grasp_delays=grasp_delays,
                                      only_held=args.only_held, num_envs=args.num_envs, env_kwargs=env_kwargs,
                                      temperature=args.temperature, seed=args.seed, only_success=args.only_success,
                                      expert_options=args.expert_kwargs)
    except (FileNotFoundError, ValueError, KeyError, VLAModelError, VlaEnvError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, indent=1))
    return 0


def corrections_env(checkpoint: Path, env_id: str | None, env_kwargs: dict) -> tuple[str, dict]:
    """The env ``collect-corrections`` runs the policy in: the scene the checkpoint was trained in
    (its task and scene options: crop, assets, render path, as recorded), which ``--env-id`` and
    ``--env-kwargs`` change; PutOnPlateInScene25Main-v3 where nothing is recorded. A policy acting
    on a view it never saw hands over in states the demos never reach, and its frames would not
    join them."""
    from vla_trainer.checkpoint import resolve_model_dir
    from vla_trainer.data.demos import scene_options
    from vla_trainer.deploy.serve import training_env

    task, trained = training_env(resolve_model_dir(checkpoint))
    return env_id or task or "PutOnPlateInScene25Main-v3", {**scene_options(trained), **env_kwargs}


class Terminated(KeyboardInterrupt):
    """SIGTERM, handled like Ctrl-C."""


_sigterm_received = threading.Event()
"""Set by the handler: inside ``ray.get`` Ray turns any signal's exception into a plain KeyboardInterrupt."""


def _terminated(signum, frame) -> None:
    _sigterm_received.set()
    raise Terminated()


def cmd_rl(args: argparse.Namespace) -> int:
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from vla_trainer.config import ConfigError, load_config, to_yaml
    from vla_trainer.models import VLAModelError
    from vla_trainer.rl.update import NonFiniteLossError

    if args.print_config and "=" in args.print_config:  # an override after a bare --print-config
        args.overrides.insert(0, args.print_config)
        args.print_config = ""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.print_config == "":
        print(to_yaml(cfg))
        return 0
    if args.print_config is not None:
        return print_config_key(cfg, args.print_config)
    import signal

    from vla_trainer.checkpoint import CheckpointWriteError
    from vla_trainer.runner import train
    from vla_trainer.runtime.errors import WorkerFailed

    # A scheduler's SIGTERM (preemption, scancel) stops the run as Ctrl-C does: envs, workers and
    # Ray closed, the last whole checkpoint kept. Without this, Python dies at once and skips all that.
    _sigterm_received.clear()
    previous = signal.signal(signal.SIGTERM, _terminated)
    try:
        result = train(cfg, run_dir=args.run_dir)
    except (ConfigError, FileNotFoundError, VLAModelError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        terminated = _sigterm_received.is_set()  # set before Terminated is raised
        print(f"{'terminated' if terminated else 'interrupted'}: envs and workers closed; resume "
              "with runner.resume_dir=auto (same --run-dir) from the last checkpoint", file=sys.stderr)
        return 143 if terminated else 130
    except CheckpointWriteError as e:
        print(f"error: training stopped: {e.strerror}", file=sys.stderr)
        return 1
    except WorkerFailed as e:
        print(f"error: training stopped: {e}. The last good checkpoint (if any) is untouched; resume with "
              "runner.resume_dir=auto (same --run-dir)", file=sys.stderr)
        return 1
    except NonFiniteLossError as e:
        print(f"error: training stopped: {e}. The last good checkpoint (if any) is untouched; "
              "lower actor.optim.lr or check the rewards.", file=sys.stderr)
        return 1
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(json.dumps({"run_dir": str(result.run_dir), "iterations": result.iterations,
                      "env_steps": result.env_steps, "last_eval": result.last_eval,
                      "checkpoint": str(result.checkpoint) if result.checkpoint else None}, indent=1))
    return 0


def cmd_recipes(args: argparse.Namespace) -> int:
    from vla_trainer.config import recipe_names, recipe_path

    from vla_trainer.config.loading import RECIPE_DIR
    from vla_trainer.config.warm_start import WARM_START_RECIPE_DIR

    for title, folder in (("RL (vla-train --config NAME)", RECIPE_DIR),
                          ("warm starts (vla-train warm-start --config NAME)", WARM_START_RECIPE_DIR)):
        print(title)
        for name in recipe_names(folder):
            first = recipe_path(name, folder).read_text().splitlines()[0].lstrip("# ")
            print(f"  {name:32s} {first}")
    return 0


# diagnostics that live in the repository's tools/ (not installed): named, not mistaken for `rl` options
DIAGNOSTICS = {"reach-report": "python -m tools.reach_report --help"}
SUBCOMMANDS = ("rl", "sft", "pretrain-vision", "sft-report", "collect-corrections", "warm-start", "publish-warm-start",
               "recipes")


def print_config_key(cfg, key: str) -> int:
    """Prints the resolved recipe's value at the dotted ``key`` as JSON (exit 2 naming the key's
    first unknown part and the keys allowed there)."""
    import json
    from dataclasses import asdict, is_dataclass

    node = cfg
    for i, part in enumerate(key.split(".")):
        if isinstance(node, (list, tuple)):  # an index, as overrides take it: actor.optim.betas.0
            keys = [str(j) for j in range(len(node))]
        else:
            keys = list(asdict(node)) if is_dataclass(node) else list(node) if isinstance(node, dict) else []
        if part not in keys:
            where = ".".join(key.split(".")[:i]) or "the recipe"
            print(f"error: --print-config {key}: {where} has no key {part!r}; its keys: {', '.join(keys) or 'none'}",
                  file=sys.stderr)
            return 2
        node = getattr(node, part) if is_dataclass(node) else node[int(part)] if isinstance(node, (list, tuple)) \
            else node[part]
    print(json.dumps(asdict(node) if is_dataclass(node) else node))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vla-train", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("rl", help="PPO / GRPO fine-tuning from a recipe (the default command)")
    r.add_argument("--config", required=True, help="a shipped recipe name (vla-train recipes) or a YAML path")
    r.add_argument("--run-dir", type=Path, default=None,
                   help="output folder (default: runner.logger.log_path/runner.logger.experiment_name)")
    r.add_argument("--print-config", nargs="?", const="", default=None, metavar="KEY",
                   help="print the resolved recipe and exit; with KEY (e.g. env.train.env_kwargs) only that "
                        "part, as JSON (for scripts)")
    r.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides, e.g. actor.optim.lr=3e-5")
    r.set_defaults(func=cmd_rl)
    c = sub.add_parser("recipes", help="list the shipped recipes")
    c.set_defaults(func=cmd_recipes)
    p = sub.add_parser("sft", help="supervised fine-tuning on recorded demos (warm start for RL)")
    v = sub.add_parser("pretrain-vision", help="teach a new model's vision towers where the scene's bodies are "
                                               "(demos' privileged poses), before sft --init-from")
    for a, batch, lr in ((p, 16, 1e-4), (v, 64, 3e-4)):
        a.add_argument("--demos", type=Path, nargs="+", required=True,
                       help="demo folder(s) (index.json + episode_*.npz); the episodes of all are used")
        a.add_argument("--preset", default="tiny-openvla-oft", help="model preset (default: %(default)s)")
        a.add_argument("--steps", type=positive_int, default=500, help="optimizer steps (default: %(default)s)")
        a.add_argument("--batch-size", type=positive_int, default=batch,
                       help="samples per step (default: %(default)s)")
        a.add_argument("--lr", type=positive_float, default=lr, help="AdamW learning rate (default: %(default)s)")
        a.add_argument("--out", type=Path, required=True,
                       help="model folder to write: new, empty, or an earlier model folder (replaced); "
                            "anything else is refused")
        a.add_argument("--seed", type=int, default=0, help="model init and minibatch seed (default: %(default)s)")
        a.add_argument("--slot-embeddings", choices=("zeros", "learned"), default=None,
                       help="OFT presets: inputs of the action slots (default: the preset's, zeros as the "
                            "official OFT; learned: one trained vector per slot, for training from scratch)")
        a.add_argument("--patch-positions", choices=("none", "sincos"), default=None,
                       help="add a trained code of each patch's place, started as 2-D sine-cosine, to the "
                            "projected patches (default: the preset's, none as the official model); with "
                            "--init-from, sincos adds the code to a checkpoint that has none")
        a.add_argument("--layout-token", choices=("none", "linear"), default=None,
                       help="add one token after the patches, a trained linear map of all patches flattened, "
                            "so a slot can read where things are from one token (default: the preset's, none "
                            "as the official model); with --init-from, linear adds it to a checkpoint without one")
        a.add_argument("--init-from", type=Path, default=None,
                       help="continue from this checkpoint folder (an earlier --out) instead of a new model "
                            "of --preset")
        a.add_argument("--unnorm-key", default=None, help="action statistics to use (default: the only one)")
    v.add_argument("--eval-every", type=positive_int, default=100,
                   help="held-out position and yaw errors every N steps (default: %(default)s)")
    v.set_defaults(func=cmd_pretrain_vision)
    p.add_argument("--proprio", action="store_true",
                   help="the policy also reads the robot state (obs['state'], as OpenVLA-OFT's proprio input), "
                        "z-scored with the demos' statistics; with --init-from, adds the input to a checkpoint "
                        "without one (default: image and instruction only, as the official OpenVLA)")
    p.add_argument("--log-every", type=positive_int, default=10,
                   help="log every N steps (default: %(default)s)")
    p.add_argument("--eval-every", type=positive_int, default=None,
                   help="every N steps, measure loss, token accuracy and greedy action L1 on up to 512 "
                        "training samples (default: only before and after)")
    p.add_argument("--warmup-steps", type=int, default=0, help="linear learning-rate warm-up (default: 0)")
    p.add_argument("--lr-schedule", choices=("constant", "cosine"), default="constant",
                   help="after warm-up: constant, or cosine down to 10%% of --lr (default: %(default)s)")
    p.add_argument("--label-sigma-bins", type=float, default=0.0,
                   help="train against a Gaussian over the action bins with this std (in bins) instead "
                        "of the target bin alone (default: 0, plain NLL)")
    p.add_argument("--scene-loss-weight", type=float, default=0.0,
                   help="co-train a grounding task: regress the expert's scene poses from the action "
                        "slots, weighted by this (default: 0, off; needs demos with scene poses)")
    p.add_argument("--first-frame-repeats", type=positive_int, default=1,
                   help="draw each episode's first frame this many times per epoch, where a scripted reach "
                        "makes its one scene-dependent decision (default: 1, every sample once)")
    p.add_argument("--release-frame-repeats", type=positive_int, default=1,
                   help="draw each sample whose action chunk holds the release (the gripper opening "
                        "after a grasp) this many times per epoch (default: 1, every sample once)")
    p.set_defaults(func=cmd_sft)
    m = sub.add_parser("warm-start", help="a supervised warm start from its recipe: demos, vision pretraining, "
                                          "SFT stages (vla-train warm-start --config tiny_put_on_plate --out DIR)")
    m.add_argument("--config", required=True,
                   help="a shipped warm-start recipe (vla-train recipes) or a YAML path")
    m.add_argument("--out", type=Path, default=None, help="the run folder; a run started again goes on from its "
                                                            "last whole stage")
    m.add_argument("--publish", nargs="?", const="", default=None, metavar="DIR",
                   help="also write the last stage in float16 with made_by.json to DIR (default: the recipe's "
                        "publish_to)")
    m.add_argument("--print-config", action="store_true", help="print the resolved recipe and exit")
    m.add_argument("overrides", nargs="*", metavar="key=value", help="recipe overrides, e.g. stages.0.sft.steps=50")
    m.set_defaults(func=cmd_warm_start)
    w = sub.add_parser("publish-warm-start",
                       help="a warm-start run folder in float16 with made_by.json (read from what its stages "
                            "recorded) and one SFT curve over all stages")
    w.add_argument("--run", type=Path, required=True, help="a vla-train warm-start --out folder")
    w.add_argument("--to", type=Path, default=None, help="the folder to write, replaced atomically (default: the "
                                                         "recipe's publish_to)")
    w.set_defaults(func=cmd_publish_warm_start)
    q = sub.add_parser("sft-report", help="where a warm start errs: action error per episode step and dimension")
    q.add_argument("--checkpoint", type=Path, required=True,
                   help="model folder, training checkpoint or run folder (its latest)")
    q.add_argument("--demos", type=Path, nargs="+", required=True, help="demo folder(s)")
    q.add_argument("--steps", default="0,1,3", help="episode steps, comma-separated (default: %(default)s)")
    q.add_argument("--json", type=Path, default=None, help="also write the report as JSON")
    q.add_argument("--unnorm-key", default=None, help=UNNORM_KEY_HELP)
    q.set_defaults(func=cmd_sft_report)
    k = sub.add_parser("collect-corrections",
                       help="demos from the policy's own states: it starts each episode, the scripted expert "
                            "takes over and finishes it (only the expert's part is recorded)")
    k.add_argument("--checkpoint", type=Path, required=True,
                   help="the policy: a model folder, training checkpoint or run folder")
    k.add_argument("--out", type=Path, required=True, help="demo folder to write (new)")
    k.add_argument("--env-id", default=None, help="a task with a scripted expert (default: the one the checkpoint "
                   "was trained in, with its scene options; else PutOnPlateInScene25Main-v3)")
    k.add_argument("--episodes", type=positive_int, default=100, help="episodes to run (default: %(default)s)")
    k.add_argument("--handover-steps", default="8,16",
                   help="env steps the policy acts before the expert takes over, one drawn per episode; "
                        "multiples of the policy's chunk (default: %(default)s)")
    k.add_argument("--handover-after-grasp", default="", metavar="D[,D...]",
                   help="also hand over D env steps after the policy first holds the object, when that comes "
                        "before the --handover-steps step; one D drawn per episode (default: off)")
    k.add_argument("--only-held", action="store_true",
                   help="keep only episodes handed over while the gripper held the object")
    k.add_argument("--num-envs", type=positive_int, default=2)
    k.add_argument("--temperature", type=positive_float, default=0.6, help="the policy's sampling temperature")
    k.add_argument("--seed", type=int, default=0)
    k.add_argument("--env-kwargs", type=json_object, default="{}",
                   help="JSON of gym.make arguments, over the checkpoint's recorded scene options")
    k.add_argument("--all", dest="only_success", action="store_false", help="keep episodes the expert failed too")
    k.add_argument("--unnorm-key", default=None, help=UNNORM_KEY_HELP)
    k.add_argument("--expert-kwargs", type=json_object, default="{}",
                   help="JSON of the scripted expert's options, as vla-envs collect-demos takes them, e.g. "
                        "'{\"max_speed\": 0.5}' to match the demos the corrections join (default: {})")
    k.set_defaults(func=cmd_collect_corrections)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in DIAGNOSTICS:
        print(f"error: {argv[0]} is a diagnostic run from a clone of the repository: {DIAGNOSTICS[argv[0]]}",
              file=sys.stderr)
        return 2
    if argv and argv[0] not in SUBCOMMANDS and argv[0] not in ("-h", "--help"):
        argv.insert(0, "rl")  # `vla-train --config X` is `vla-train rl --config X`
    parser = build_parser()
    # key=value overrides may stand on either side of an option (`X=1 --run-dir D Y=2`); argparse
    # fills a positional list once, so the ones after an option come back unrecognised
    args, extra = parser.parse_known_args(argv)
    if extra:
        if isinstance(getattr(args, "overrides", None), list) and all(
                "=" in x and not x.startswith("-") for x in extra):
            args.overrides += extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
