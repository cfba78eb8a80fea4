"""``franka-eval``: run a sim-trained checkpoint on the real Franka, zero-shot.

    franka-eval --checkpoint runs/main/grpo --robot-ip 172.16.0.2 --camera-serial 123622270136 \\
        --instruction "put carrot on plate" --episodes 10 --camera-file cell_camera.json --out runs/real

The arm is driven by franky (``--robot-ip``), or, where the robot PC's ROS 2 stack owns it, through
that stack (``--ros-arm cell_ros_arm.yaml``, a ``real_robot.ros_arm.RosArmConfig``).

Order of events: the files given (``--camera-file``, ``--safety-limits``, ``--ros-arm``) are read and
checked; the checkpoint is loaded and checked against the env (image size, camera crop,
state layout, action convention: an error names both sides); the calibration drift check runs
when a reference is given; the arm and camera connect; then for each episode the operator sets the
scene up and presses Enter, the arm homes to the twin's rest pose, and the policy runs at the
twin's 5 Hz until the time limit or until the operator marks success (``s`` + Enter) or failure
(``f`` + Enter). Every command passes the always-on safety layer. Each episode is recorded in the
demonstration format (``vla_envs.demos``: observations, the actions really sent, in the twin's
convention, and the operator's label), so real episodes can feed ``vla-train sft``. The end
prints and saves a table with both success notions and their 95 % intervals.

Ctrl-C (or SIGTERM) stops the arm where it is; the episodes recorded so far stay on disk.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
import time
from pathlib import Path
from typing import Any

from vla_envs.arguments import positive_float, positive_int
from vla_trainer.deploy.fit import check_fit


def _crop(text: str) -> tuple[int, int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"--camera-crop takes LEFT,TOP,RIGHT,BOTTOM in pixels, got {text!r}")
    return values  # type: ignore[return-value]


def _speed_scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}")
    return value


def check_files(args: argparse.Namespace) -> str | None:
    """Why a file given on the command line cannot be used, naming its flag; None when all can.
    Runs before the checkpoint loads, and covers ``--ros``, whose nodes would only log it."""
    from real_robot.ros_arm import RosArmConfig
    from real_robot.safety import SafetyLimits
    from vla_envs.camera_file import load_camera_file

    for flag, path, load, what in (
            ("--ros-arm", args.ros_arm, RosArmConfig.from_file, "a RosArmConfig YAML file"),
            ("--safety-limits", args.safety_limits, SafetyLimits.from_file, "a YAML/JSON safety limits file"),
            ("--camera-file", args.camera_file, load_camera_file, "a camera file (vla-calibrate handeye writes one)")):
        if path is None:
            continue
        if path.is_dir():
            return f"{flag} {path} is a folder; give {what}"
        if not path.exists():
            return f"{flag} {path} does not exist; give {what}"
        try:
            load(path)
        except (OSError, ValueError) as e:
            return f"{flag}: {e}"
    return None


def check_out(args: argparse.Namespace) -> str | None:
    """Why ``--out`` cannot take this run's episodes (real episodes are never overwritten), naming
    it; None when it can. Without ``--out``, a new dated folder under ``runs/franka_eval``."""
    from vla_envs.demos import check_new_demo_folder

    if args.out is None:
        args.out = Path("runs/franka_eval") / time.strftime("%Y%m%d-%H%M%S")
    if args.out.exists() and not args.out.is_dir():
        return f"--out {args.out} is a file; give a new folder"
    try:
        check_new_demo_folder(args.out / "episodes")
    except FileExistsError:
        return f"--out {args.out} holds the episodes of an earlier run; give a new folder"
    return None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from vla_trainer.deploy.serve import torch_device

    p = argparse.ArgumentParser(prog="franka-eval", description="Run a sim-trained checkpoint on the real Franka.")
    p.add_argument("--checkpoint", required=True, type=Path, help="model folder, training checkpoint or run folder")
    p.add_argument("--device", type=torch_device, default="cpu",
                   help="torch device of the policy: cpu, cuda, cuda:N (with --ros: the policy node's)")
    arm = p.add_mutually_exclusive_group(required=True)
    arm.add_argument("--robot-ip", help="the robot's control box (FCI), e.g. 172.16.0.2: the arm is driven by franky")
    arm.add_argument("--ros-arm", type=Path, help="instead, a RosArmConfig YAML: the arm through the robot PC's "
                                                  "running ROS 2 stack (docs/real_robot.md)")
    cam = p.add_mutually_exclusive_group(required=True)
    cam.add_argument("--camera-serial", help="the RealSense's serial number")
    cam.add_argument("--playback", help="a RealSense .db3 recording instead of a live camera (dry runs, tests)")
    p.add_argument("--instruction", required=True, help='the task in words, as in training: "put carrot on plate"')
    p.add_argument("--episodes", type=positive_int, default=10)
    p.add_argument("--time-limit", type=positive_int, default=80, help="steps per episode (the twin's: 80)")
    p.add_argument("--camera-file", type=Path, help="the calibrated camera file (vla-calibrate handeye)")
    p.add_argument("--camera-crop", type=_crop, help="LEFT,TOP,RIGHT,BOTTOM; default: the checkpoint's")
    p.add_argument("--image-size", type=int, help="default: the checkpoint's")
    p.add_argument("--safety-limits", type=Path, help="YAML/JSON safety limits (docs/real_robot.md); default: conservative")
    p.add_argument("--dry-run", action="store_true", help="log every command, move nothing")
    p.add_argument("--operator", choices=("keyboard", "scripted"), default="keyboard",
                   help="scripted: no prompts, no labels (episodes run to the time limit)")
    p.add_argument("--relative-dynamics", type=_speed_scale, default=0.1, help="speed scale of the arm, (0, 1]")
    p.add_argument("--ignore-realtime", action="store_true", help="no realtime kernel (a simulated arm only)")
    p.add_argument("--drift-reference", type=Path, help="a `vla-calibrate drift pin` folder to check first")
    p.add_argument("--drift-override", action="store_true", help="run even if the camera moved beyond the limits")
    p.add_argument("--out", type=Path, default=None,
                   help="a new folder for the episodes and the results table (default: runs/franka_eval/<date-time>); "
                        "one holding an earlier run's episodes is refused")
    p.add_argument("--ros", action="store_true",
                   help="run the policy, camera and arm bridge as ROS 2 nodes (the same spec as "
                        "launch/franka_eval.launch.py) until Ctrl-C or --ros-seconds; no episodes or labels")
    p.add_argument("--ros-seconds", type=positive_float, default=None,
                   help="with --ros: stop the nodes after this long")
    p.add_argument("--ros-domain-id", type=int, default=None,
                   help="with --ros: the nodes' DDS domain (default: the inherited ROS_DOMAIN_ID, as ros2 launch); "
                        "discovery stays on this machine unless --ros-arm needs the robot PC's stack")
    return p.parse_args(argv)


def _episode_row(info: dict[str, Any], label: str) -> dict[str, Any]:
    return {"label": label, **{k: float(v) for k, v in info.items()}}


def summary(rows: list[dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The results table (markdown) and its numbers: both success notions with 95 % intervals."""
    from vla_trainer.rl.evaluation import wilson_interval

    n = len(rows)
    out: dict[str, Any] = {"episodes": n}
    lines = ["| metric | rate | 95 % interval |", "|---|---|---|"]
    for key in ("success_once", "success_at_end"):
        k = int(sum(r[key] > 0.5 for r in rows))
        lo, hi = wilson_interval(k, n) if n else (0.0, 1.0)
        out[key] = {"successes": k, "rate": k / n if n else 0.0, "interval_95": [lo, hi]}
        lines.append(f"| {key} | {k}/{n} = {100 * k / max(n, 1):.1f} % | {100 * lo:.1f}-{100 * hi:.1f} % |")
    clamps = {k: int(sum(r.get(k, 0) for r in rows)) for k in (rows[0] if rows else {}) if k.startswith("clamp_")}
    out["safety_clamps"] = clamps
    lines.append("")
    lines.append("labels: " + ", ".join(f"{i}: {r['label']}" for i, r in enumerate(rows)))
    if any(clamps.values()):
        lines.append("safety clamps: " + ", ".join(f"{k[6:]} {v}" for k, v in clamps.items() if v))
    return "\n".join(lines), out


def run_episodes(env, policy, args, out_dir: Path, rows: list[dict[str, Any]]) -> None:
    """The episodes, each recorded as a demo; appends one row per finished episode to ``rows``
    (what was finished stays there when a later episode is interrupted)."""
    import numpy as np

    from vla_envs.backends.franka.twin import twin_action_from_scaled
    from vla_envs.demos import EpisodeRecorder

    backend = env.backend
    dry_run = bool(backend.safety.limits.dry_run)  # --dry-run or the limits file's: nothing was executed
    recorder = EpisodeRecorder(out_dir / "episodes", 1, "franka/PutOnPlate-v0", None, only_success=False,
                               env_kwargs={"image_size": backend.image_size, "camera_crop": backend.camera_crop})
    seen: list[dict[str, np.ndarray]] = []
    env.add_step_observer(lambda s: seen.append({"image": s["obs"]["image"].copy(), "state": s["obs"]["state"].copy()}))
    for episode in range(args.episodes):
        obs, _ = env.reset(seed=episode)
        print(f"episode {episode + 1}/{args.episodes}: running", flush=True)
        seen.clear()
        backend.sent_log.clear()
        info = None
        while info is None:
            chunk = policy.act(obs["image"][0], args.instruction, obs["state"][0])
            before = [{"image": obs["image"], "state": obs["state"]}]
            out = env.chunk_step(chunk[None])
            before += seen[:-1]
            for k, (o, sent) in enumerate(zip(before, backend.sent_log)):  # the sub-steps sent, in order
                action = twin_action_from_scaled(sent.action)[None]
                recorder.add(o, action, out.rewards[:, k], out.info["success"][:, k])
            seen.clear()
            backend.sent_log.clear()
            obs = out.obs
            if "episode" in out.info:
                info = {k: v[0] for k, v in out.info["episode"].items()}
        label = ("success" if info["success_once"] else "failure") if bool(out.terminated.any()) else "time_limit"
        recorder.finish(0, args.instruction, 0, {k: v for k, v in info.items()},
                        extra={"label": label, **({"dry_run": True} if dry_run else {})})
        rows.append(_episode_row(info, label))
        print(f"episode {episode + 1}/{args.episodes}: {label}, {int(info['length'])} steps", flush=True)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from vla_envs.backends.franka.twin import STATE_DIM
    from vla_envs.camera_file import load_camera_file
    from vla_trainer.deploy.serve import PolicyService

    if problem := check_files(args) or check_out(args):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    try:
        policy = PolicyService(args.checkpoint, device=args.device)
        camera = load_camera_file(args.camera_file)
        image_size, crop = check_fit(policy.spec, image_size=args.image_size, camera_crop=args.camera_crop,
                                     state_dim=STATE_DIM, camera_hw=(camera.height, camera.width))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.drift_reference is not None:
        status = _drift_check(args)
        if status:
            return status
    if args.ros:
        del policy  # the policy node loads its own copy
        return run_ros(args, crop)
    from real_robot.errors import RealRobotError, RealtimeKernelError
    from vla_envs.backends.franka.make import make_franka_vector_env

    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM as Ctrl-C: the finally below stops the arm and releases the devices either way
    previous = signal.signal(signal.SIGTERM, _interrupt)
    env = None
    rows: list[dict[str, Any]] = []
    status = 0
    try:
        env = make_franka_vector_env(
            robot_ip=args.robot_ip, ros_arm=args.ros_arm, instruction=args.instruction, camera_serial=args.camera_serial,
            playback_file=args.playback, image_size=image_size, camera_crop=crop, camera_file=args.camera_file,
            time_limit=args.time_limit, safety_limits=args.safety_limits, dry_run=args.dry_run,
            operator=args.operator, relative_dynamics_factor=args.relative_dynamics,
            ignore_realtime=args.ignore_realtime)
        run_episodes(env, policy, args, args.out, rows)
    except KeyboardInterrupt:
        print("\ninterrupted: the arm was stopped; episodes so far are in "
              f"{args.out / 'episodes'}", file=sys.stderr)
        status = 130
    except RealtimeKernelError as e:
        print(f"error: {RealtimeKernelError(e.detail, 'pass --ignore-realtime')}", file=sys.stderr)
        status = 2
    except (ConnectionError, ValueError, FileNotFoundError, TimeoutError, EOFError, RealRobotError) as e:
        print(f"error: {e}", file=sys.stderr)
        status = 2
    finally:
        try:
            if env is not None:
                env.close()  # stops the arm, releases it and the camera; a Ctrl-C meanwhile waits for it
        except KeyboardInterrupt:
            status = 130
        signal.signal(signal.SIGTERM, previous)
    if status and not rows:
        return status
    table, numbers = summary(rows)  # after a fault: the episodes finished before it
    header = (f"checkpoint: {policy.spec.model_dir}; instruction: {args.instruction!r}; {len(rows)} "
              f"{'' if not status else f'of {args.episodes} '}episodes on the real Franka at "
              f"{args.robot_ip or args.ros_arm}{' (dry run)' if args.dry_run else ''}"
              f"{'' if not status else ' (stopped early)'}; {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"\n{header}\n\n{table}")
    (args.out / "results.md").write_text(f"{header}\n\n{table}\n")
    (args.out / "results.json").write_text(json.dumps({"checkpoint": policy.spec.model_dir, **numbers,
                                                       "episodes_rows": rows, "stopped_early": bool(status)},
                                                      indent=1))
    return status


def ros_specs(args, crop) -> list:
    """The camera, policy and bridge node specs of ``--ros`` (what ``ros2 launch`` builds from the same
    values: ``vla_trainer.deploy.ros_graph.graph_from_launch_arguments``)."""
    from vla_trainer.deploy.ros_graph import franka_eval_graph

    return franka_eval_graph(
        checkpoint=str(args.checkpoint), robot_ip=args.robot_ip or "", ros_arm_file=str(args.ros_arm or ""),
        instruction=args.instruction,
        camera_serial=args.camera_serial or "", playback_file=args.playback or "", camera_crop=crop,
        camera_file=str(args.camera_file or ""), safety_limits_file=str(args.safety_limits or ""),
        dry_run=args.dry_run, relative_dynamics_factor=args.relative_dynamics,
        ignore_realtime=args.ignore_realtime, home_on_start=True, device=args.device)


def run_ros(args, crop) -> int:
    """``--ros``: the camera, policy and bridge nodes from ``vla_trainer.deploy.ros_graph``, started
    without the ROS 2 CLI and supervised: a node that exits stops the others (exit 1, named);
    Ctrl-C / SIGTERM / ``--ros-seconds`` stop them all (the bridge stops the arm)."""
    from vla_trainer.deploy.ros_graph import local_ros_env, start_nodes, stop_nodes

    try:
        specs = ros_specs(args, crop)
        env = local_ros_env(args.ros_domain_id, localhost=args.ros_arm is None)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    procs = start_nodes(specs, env, log_dir=args.out / "ros_logs")
    print(f"started {', '.join(s.name for s in specs)} (logs: {args.out / 'ros_logs'}); Ctrl-C stops them", flush=True)
    status, deadline = 0, None if args.ros_seconds is None else time.monotonic() + args.ros_seconds
    try:
        while deadline is None or time.monotonic() < deadline:
            dead = [(spec.name, proc.returncode) for spec, proc in zip(specs, procs) if proc.poll() is not None]
            if dead:
                print(f"error: node(s) exited: {dead}; see {args.out / 'ros_logs'}", file=sys.stderr)
                status = 1
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        stop_nodes(procs)
        signal.signal(signal.SIGTERM, previous)
    print("stopped every node", flush=True)
    return status


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _drift_check(args) -> int:
    """0 when the camera has not moved beyond the reference's limits (or ``--drift-override``)."""
    try:
        from calibration.drift import check_drift
    except ImportError as e:
        print(f"error: the drift check needs the calibration package ({e})", file=sys.stderr)
        return 2
    import numpy as np

    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig

    from calibration.errors import CalibrationError

    from vla_envs.camera_file import load_camera_file

    try:
        size = load_camera_file(args.camera_file)  # the calibrated resolution, as the episodes' camera opens it
        with RealSenseCamera(RealSenseCameraConfig(serial=args.camera_serial or "", playback_file=args.playback,
                                                   width=size.width, height=size.height)) as cam:
            image = cam.read(timeout_ms=3000).image
        report = check_drift(args.drift_reference, np.asarray(image), camera_file=args.camera_file)
    except (CalibrationError, ConnectionError, FileNotFoundError, TimeoutError, ValueError) as e:
        print(f"error: the calibration drift check could not run: {e}", file=sys.stderr)
        return 2
    print(f"calibration drift: {report.summary()}", flush=True)
    if not report.passed:
        if not args.drift_override:
            print("error: the camera moved since calibration beyond the limits; recalibrate (vla-calibrate handeye) "
                  "or pass --drift-override", file=sys.stderr)
            return 3
        print("warning: running despite the drift (--drift-override)", file=sys.stderr)
    return 0
