"""``vla-calibrate``: print the board, calibrate intrinsics, solve hand-eye into the camera file,
check it against the real camera (overlay) and watch the camera for drift.

    vla-calibrate board --out calib/board
    vla-calibrate intrinsics --images calib/intrinsics --board calib/board/board.json --out calib/intrinsics.json
    vla-calibrate handeye --session calib/session --out calib/camera.json
    vla-calibrate handeye --robot-ip 172.16.0.2 --camera-serial 123622270136 --board calib/board/board.json \\
        --safety-limits cell_limits.yaml --session-dir calib/session --out calib/camera.json
    vla-calibrate overlay --camera-file calib/camera.json --image real.png --out overlay.png [--qpos Q1 .. Q7]
    vla-calibrate drift pin --camera-file calib/camera.json --image ref.png --board board.json --out calib/drift_ref
    vla-calibrate drift check --reference calib/drift_ref --image now.png
    vla-calibrate selftest

Exit status: 0 done; 1 the data cannot be calibrated (board not found, too few or too similar
poses, the twin cannot be rendered) or a device failed (the robot or the camera, named); 2 a bad
argument (named); 3 the result is worse than the limits (``--max-trans-mm``/``--max-rot-deg``,
``--max-rms-px``, the drift limits), so nothing was written unless ``--accept`` was given
(``--override`` for drift); 130 interrupted (live collection: the arm was stopped). Never prompts.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from calibration.board import DICTIONARY_SIZES, BoardSpec
from calibration.drift import DEFAULT_MAX_DEG as DRIFT_MAX_DEG
from calibration.drift import DEFAULT_MAX_MM as DRIFT_MAX_MM
from calibration.drift import DEFAULT_MAX_PX as DRIFT_MAX_PX
from calibration.hand_eye import DEFAULT_MAX_ROT_DEG, DEFAULT_MAX_TRANS_MM, METHODS, MIN_SAMPLES
from vla_envs.arguments import int_at_least, positive_float

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_OVER_LIMIT = 0, 1, 2, 3


class UsageError(Exception):
    """A command-line argument is wrong; ``argument`` names it."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"argument {argument}: {message}")


def existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a folder")
    return path


def existing_file(text: str) -> Path:
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a folder, not a file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} does not exist")
    return path


def crop_box(text: str) -> tuple[int, int, int, int]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 4:
        raise argparse.ArgumentTypeError(f"must be four integers L,T,R,B (pixels of the camera file), got {text!r}")
    return values


def load_board(path: Path) -> BoardSpec:
    try:
        return BoardSpec.load(path)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError("--board", str(e)) from None


# ---------------------------------------------------------------------------------- board
BOARD_ARGS = {"squares_x": "--squares-x", "squares_y": "--squares-y", "square_length_m": "--square-length-mm",
              "marker_length_m": "--marker-length-mm", "dictionary": "--dictionary"}


def cmd_board(args: argparse.Namespace) -> int:
    from calibration.printout import printout_summary, write_printout

    if args.out.exists() and not args.out.is_dir():
        raise UsageError("--out", f"{args.out} is a file; give the folder for board.png, board.pdf and board.json")
    try:
        spec = BoardSpec(squares_x=args.squares_x, squares_y=args.squares_y,
                         square_length_m=args.square_length_mm / 1000.0, marker_length_m=args.marker_length_mm / 1000.0,
                         dictionary=args.dictionary)
    except ValueError as e:
        field = re.match(r"board (\w+)", str(e))  # BoardSpec's errors start with "board <field>"
        raise UsageError(BOARD_ARGS.get(field.group(1) if field else "", "--squares-x"), str(e)) from None
    try:
        printout = write_printout(spec, args.out, dpi=args.dpi)
    except ValueError as e:
        raise UsageError("--dpi", str(e)) from None
    except OSError as e:  # e.g. a file where a parent folder should be, or no permission
        raise UsageError("--out", f"cannot write into {args.out}: {e.strerror or e}") from None
    print(printout_summary(printout))
    print(f"Board {spec.width_m * 1000:g} x {spec.height_m * 1000:g} mm. After printing, measure a square: it must be "
          f"{spec.square_length_m * 1000:g} mm (otherwise edit square_length_m and marker_length_m in board.json).")
    return EXIT_OK


# ---------------------------------------------------------------------------------- intrinsics
def check_out_file(flag: str, path: Path, example: str) -> None:
    """Refuse an output file path that cannot be written, before any work: a folder, or one whose
    nearest existing parent is a file."""
    if path.is_dir():
        raise UsageError(flag, f"{path} is a folder; give the file's path (e.g. {example})")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(flag, f"{path} cannot be written: {parent} is a file, not a folder")


def cmd_intrinsics(args: argparse.Namespace) -> int:
    from calibration.intrinsics import calibrate_intrinsics, load_images, save_intrinsics

    if args.out is not None:
        check_out_file("--out", Path(args.out), "intrinsics.json")
    spec = load_board(args.board)
    try:
        images = load_images(args.images)
    except (FileNotFoundError, ValueError) as e:
        raise UsageError("--images", str(e)) from None
    result = calibrate_intrinsics(images, spec, min_images=args.min_images)
    print(result.summary())
    if result.rms_px > args.max_rms_px and not args.accept:
        print(f"FAIL: RMS reprojection error {result.rms_px:.3f} px > --max-rms-px {args.max_rms_px:g}; "
              "nothing written (blurred or too few varied views? pass --accept to keep it anyway)", file=sys.stderr)
        return EXIT_OVER_LIMIT
    if args.out is not None:
        print(f"wrote {save_intrinsics(result, args.out)}")
    return EXIT_OK


# ---------------------------------------------------------------------------------- hand-eye
LIVE_ARGS = {"robot_ip": "--robot-ip", "camera_serial": "--camera-serial", "playback": "--playback", "board": "--board",
             "intrinsics": "--intrinsics", "factory_intrinsics": "--factory-intrinsics", "poses": "--poses",
             "num_poses": "--num-poses", "camera_position": "--camera-position", "safety_limits": "--safety-limits",
             "relative_dynamics": "--relative-dynamics", "ignore_realtime": "--ignore-realtime",
             "settle_s": "--settle-s", "session_dir": "--session-dir"}
DEFAULT_NUM_POSES = 15
DEFAULT_RELATIVE_DYNAMICS = 0.1


def cmd_handeye(args: argparse.Namespace) -> int:
    check_out_file("--out", args.out, "camera.json")
    if args.session is not None and args.robot_ip is not None:
        raise UsageError("--session", "give --session (solve a recorded folder) or --robot-ip (collect live, then "
                                      "solve), not both")
    if args.session is None and args.robot_ip is None:
        raise UsageError("--session", "give --session DIR to solve a recorded session, or --robot-ip IP with the "
                                      "camera, --board and --session-dir to collect one live")
    if args.session is None:
        status = collect_live(args)
        if status != EXIT_OK:
            return status
        session = args.session_dir
    else:
        given = [flag for name, flag in LIVE_ARGS.items() if getattr(args, name) not in (None, False)]
        if given:
            raise UsageError(given[0], "belongs to live collection (--robot-ip); --session solves a recorded folder")
        session = args.session
    return solve_and_write(args, session)


def solve_and_write(args: argparse.Namespace, session: Path) -> int:
    from calibration.camera_file import calibration_block, write_camera_file, write_wrist_camera_file
    from calibration.hand_eye import Mode
    from calibration.session import solve_session

    try:
        result = solve_session(session, method=args.method, max_trans_mm=args.max_trans_mm,
                               max_rot_deg=args.max_rot_deg, min_samples=args.min_samples)
    except FileNotFoundError as e:
        raise UsageError("--session", str(e)) from None
    print(result.summary())
    hand_eye = result.hand_eye
    from calibration.plots import plot_residuals

    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    # beside the camera file only the plot of the solution it holds: a failed run's goes apart
    written = hand_eye.passed or args.accept
    plot = plot_residuals(hand_eye, Path(args.out).with_name(
        Path(args.out).stem + ("_residuals.png" if written else "_residuals_failed.png")))
    print(f"residual plot: {plot}")
    if not written:
        print(f"FAIL: residuals or board scale above the limits; {args.out} not written. Check the board spec "
              "(measured square length), the intrinsics, that the board is rigid on the flange, and drop the worst samples; or pass "
              "--accept to write it anyway", file=sys.stderr)
        return EXIT_OVER_LIMIT
    block = calibration_block(result, accepted=not hand_eye.passed)
    intrinsics = result.session.spec.intrinsics
    if hand_eye.mode is Mode.EYE_TO_HAND:
        path = write_camera_file(args.out, intrinsics=intrinsics, T_base_from_cam=hand_eye.T_base_from_cam,
                                 calibration=block)
        position = hand_eye.T_base_from_cam[:3, 3]
        print(f"wrote {path}: camera at ({position[0]:.4f}, {position[1]:.4f}, {position[2]:.4f}) m in the base frame; "
              f"use it with gym.make(..., camera_file={str(path)!r})")
    else:
        path = write_wrist_camera_file(args.out, intrinsics=intrinsics, T_ee_from_cam=hand_eye.T_ee_from_cam,
                                       calibration=block)
        print(f"wrote {path} (eye-in-hand: T_ee_from_cam)")
    return EXIT_OK


def collect_live(args: argparse.Namespace) -> int:
    """``handeye --robot-ip``: check every argument, then connect the camera and the arm, home, record
    the session through the safety layer (``calibration.collect``), home again."""
    import json

    import numpy as np

    from calibration.collect import calibration_poses, load_poses, pose_limit_problems
    from calibration.intrinsics import Intrinsics
    from real_robot.franky_arm import FrankyArmConfig
    from real_robot.realsense import RealSenseCameraConfig
    from real_robot.safety import SafetyLimits

    if args.board is None:
        raise UsageError("--board", "live collection needs the board.json of the board on the flange")
    board = load_board(args.board)
    if args.session_dir is None:
        raise UsageError("--session-dir", "live collection needs a new folder to record the session into")
    if args.session_dir.exists() and not args.session_dir.is_dir():
        raise UsageError("--session-dir", f"{args.session_dir} is a file; give a new folder")
    if (args.session_dir / "session.json").exists():
        raise UsageError("--session-dir", f"{args.session_dir} already holds a session; record into a new folder "
                                          "(or solve it with --session)")
    if args.camera_serial is None and args.playback is None:
        raise UsageError("--camera-serial", "live collection needs the camera: its serial (--camera-serial) or a "
                                            "recording (--playback)")
    try:
        limits = SafetyLimits.from_file(args.safety_limits) if args.safety_limits else SafetyLimits()
    except (ValueError, OSError) as e:
        raise UsageError("--safety-limits", str(e)) from None
    if limits.dry_run:
        raise UsageError("--safety-limits", "dry_run is true: calibration has to move the arm")
    intrinsics = None
    if args.intrinsics is not None:
        try:
            intrinsics = Intrinsics.from_dict(json.loads(args.intrinsics.read_text()), str(args.intrinsics))
        except (ValueError, OSError) as e:  # JSONDecodeError is a ValueError
            raise UsageError("--intrinsics", str(e)) from None
    if args.poses is not None:
        try:
            poses = load_poses(args.poses)
        except (ValueError, OSError) as e:
            raise UsageError("--poses", str(e)) from None
        for i, T in enumerate(poses):
            if problems := pose_limit_problems(T, limits):
                raise UsageError("--poses", f"pose {i} lies outside the safety limits: {'; '.join(problems)}")
    else:
        try:
            poses = calibration_poses(limits, args.num_poses or DEFAULT_NUM_POSES,
                                      camera_position_m=args.camera_position)
        except ValueError as e:
            flag = "--camera-position" if "facing the camera" in str(e) else "--safety-limits"
            raise UsageError(flag, str(e)) from None
    factor = args.relative_dynamics or min(DEFAULT_RELATIVE_DYNAMICS, limits.max_relative_dynamics_factor)
    if not 0 < factor <= limits.max_relative_dynamics_factor:
        raise UsageError("--relative-dynamics", f"{factor:g} is above the safety limits' max_relative_dynamics_factor "
                                                f"{limits.max_relative_dynamics_factor:g}")
    try:
        arm_config = FrankyArmConfig(robot_ip=args.robot_ip, relative_dynamics_factor=factor,
                                     ignore_realtime=args.ignore_realtime)
    except ValueError as e:
        raise UsageError("--robot-ip" if "robot_ip" in str(e) else "--relative-dynamics", str(e)) from None
    if args.playback is not None and not Path(args.playback).is_file():
        raise UsageError("--playback", f"{args.playback} does not exist")
    width, height = (intrinsics.width, intrinsics.height) if intrinsics is not None else (640, 480)
    try:
        camera_config = RealSenseCameraConfig(serial=args.camera_serial or "", width=width, height=height,
                                              playback_file=None if args.playback is None else str(args.playback))
    except ValueError as e:
        raise UsageError("--playback" if args.playback else "--camera-serial", str(e)) from None

    positions = np.array([T[:3, 3] for T in poses])
    span = ", ".join(f"{axis} {lo:.3f}..{hi:.3f}" for axis, lo, hi in zip("xyz", positions.min(0), positions.max(0)))
    box = ", ".join(f"{axis} {lo:.3f}..{hi:.3f}" for axis, lo, hi in
                    zip("xyz", limits.workspace_min_m, limits.workspace_max_m))
    print(f"{len(poses)} poses, TCP {span} m. Safety limits {args.safety_limits or '(defaults)'}: box {box} m, steps "
          f"<= {limits.max_translation_per_step_m:g} m / {limits.max_rotation_per_step_rad:g} rad, speed {factor:g}. "
          "The arm homes, visits each pose, and homes again: keep clear, a hand on the stop button.", flush=True)
    return _run_devices(args, arm_config, camera_config, limits, board, intrinsics, poses)


def _run_devices(args, arm_config, camera_config, limits, board, intrinsics, poses) -> int:
    from calibration.collect import collect_session
    from calibration.hand_eye import Mode
    from calibration.session import SessionSpec
    from real_robot.errors import RealRobotError, RealtimeKernelError
    from real_robot.franky_arm import FrankyArm
    from real_robot.realsense import RealSenseCamera
    from real_robot.safety import SafetyLayer

    try:
        with RealSenseCamera(camera_config) as camera:
            if intrinsics is None:
                intrinsics = _factory_intrinsics(camera)
                K = intrinsics.camera_matrix
                print(f"factory intrinsics of {camera}: {intrinsics.width}x{intrinsics.height}, fx {K[0, 0]:.2f} "
                      f"fy {K[1, 1]:.2f} cx {K[0, 2]:.2f} cy {K[1, 2]:.2f}", flush=True)
            spec = SessionSpec(mode=Mode.EYE_TO_HAND, board=board, intrinsics=intrinsics, ee_frame="tcp")
            with FrankyArm(arm_config) as arm, SafetyLayer(arm, limits) as safety:
                safety.home()
                collect_session(safety, camera, spec, poses, args.session_dir, settle_s=args.settle_s or 0.5,
                                min_samples=args.min_samples, report=lambda line: print(line, flush=True))
                safety.home()
    except KeyboardInterrupt:
        print(f"\ninterrupted: the arm was stopped; the samples so far are in {args.session_dir}", file=sys.stderr)
        return 130
    except RealtimeKernelError as e:
        print(f"vla-calibrate handeye: {RealtimeKernelError(e.detail, 'pass --ignore-realtime')}", file=sys.stderr)
        return EXIT_FAILED
    except (RealRobotError, ConnectionError, TimeoutError, FileNotFoundError) as e:
        print(f"vla-calibrate handeye: {e}", file=sys.stderr)
        return EXIT_FAILED
    print(f"recorded {args.session_dir}; solving it", flush=True)
    return EXIT_OK


def _factory_intrinsics(camera):
    """The RealSense's own intrinsics of the colour stream it is streaming (no distortion model other
    than OpenCV's Brown-Conrady, or none, is taken as it is)."""
    from calibration.intrinsics import intrinsics_from_matrix
    from real_robot.realsense import import_pyrealsense2

    rs = import_pyrealsense2()
    pipeline = getattr(camera, "_pipeline", None)  # RealSenseCamera's running pipeline: the stream's profile
    if pipeline is None:
        raise UsageError("--factory-intrinsics", f"{camera} reports no intrinsics; give --intrinsics")
    intr = pipeline.get_active_profile().get_stream(rs.stream.color).as_video_stream_profile().get_intrinsics()
    coeffs = [float(c) for c in intr.coeffs]
    if intr.model not in (rs.distortion.none, rs.distortion.brown_conrady) and any(abs(c) > 1e-9 for c in coeffs):
        raise UsageError("--factory-intrinsics", f"{camera} reports the distortion model {intr.model} with coefficients "
                                                 f"{coeffs}, which OpenCV does not take as they are; calibrate the "
                                                 "intrinsics (vla-calibrate intrinsics) and pass --intrinsics")
    K = [[intr.fx, 0.0, intr.ppx], [0.0, intr.fy, intr.ppy], [0.0, 0.0, 1.0]]
    return intrinsics_from_matrix(K, coeffs[:5], width=int(intr.width), height=int(intr.height),
                                  source=f"{camera} factory intrinsics")


# ---------------------------------------------------------------------------------- overlay
def cmd_overlay(args: argparse.Namespace) -> int:
    import numpy as np

    from calibration.overlay import NUM_ARM_JOINTS, TwinRenderer, TwinUnavailableError, fit_to_view, read_image, \
        write_overlay
    from vla_envs.camera_file import load_camera_file

    if args.out.suffix.lower() != ".png":
        raise UsageError("--out", f"{args.out} must be a .png file (the report goes beside it as .json)")
    if args.out.is_dir():
        raise UsageError("--out", f"{args.out} is a folder; give the overlay PNG's path (e.g. overlay.png)")
    try:
        camera = load_camera_file(args.camera_file)
    except ValueError as e:
        raise UsageError("--camera-file", str(e)) from None
    try:
        camera.check_crop(args.camera_crop)
    except ValueError as e:
        raise UsageError("--camera-crop", str(e)) from None
    checks = [("--image", args.image, False)] + ([("--real-mask", args.real_mask, True)] if args.real_mask else [])
    fitted = {}
    for flag, path, gray in checks:
        try:
            fitted[flag] = fit_to_view(read_image(path, "file", gray=gray), camera, args.camera_crop, str(path))
        except ValueError as e:
            raise UsageError(flag, str(e)) from None
    if args.real_mask and not (fitted["--real-mask"] > 127).any():
        raise UsageError("--real-mask", f"{args.real_mask} has no robot pixels (robot = gray level above 127)")
    if args.qpos is not None and (len(args.qpos) != NUM_ARM_JOINTS or not np.isfinite(args.qpos).all()):
        raise UsageError("--qpos", f"give the {NUM_ARM_JOINTS} arm joint angles in radians, got {args.qpos}")
    try:
        renderer = TwinRenderer(args.camera_file, args.camera_crop)
    except TwinUnavailableError as e:
        print(f"vla-calibrate overlay: {e}", file=sys.stderr)
        return EXIT_FAILED
    with renderer:
        try:
            view = renderer.render(args.qpos)
        except ValueError as e:
            raise UsageError("--qpos", str(e)) from None
    real_mask = fitted["--real-mask"] > 127 if args.real_mask else None
    report = write_overlay(args.out, fitted["--image"], view, mode=args.mode, image=str(args.image),
                           camera_file=args.camera_file, camera_crop=args.camera_crop, real_mask=real_mask,
                           real_mask_name=str(args.real_mask) if args.real_mask else None)
    print(report.summary())
    print(f"wrote {args.out} ({args.mode}) and {args.out.with_suffix('.json')}")
    return EXIT_OK


# ---------------------------------------------------------------------------------- drift
def cmd_drift_pin(args: argparse.Namespace) -> int:
    from calibration.drift import pin_reference
    from vla_envs.camera_file import load_camera_file

    spec = load_board(args.board)
    try:
        load_camera_file(args.camera_file)
    except ValueError as e:
        raise UsageError("--camera-file", str(e)) from None
    if args.out.exists() and not args.out.is_dir():
        raise UsageError("--out", f"{args.out} is a file; give the reference folder")
    _check_readable(args.image)
    reference = pin_reference(args.out, args.camera_file, args.image, spec)
    t = reference.T_cam_from_board[:3, 3]
    print(f"pinned {args.out}: {len(reference.corner_ids)} corners of the board ({spec.describe()}), its origin "
          f"corner at ({t[0]:.3f}, {t[1]:.3f}, {t[2]:.3f}) m in the camera, reprojection RMS {reference.pnp_rms_px:.3f} px; "
          f"camera file {reference.camera_file} sha256 {reference.camera_file_sha256[:12]}. "
          "Keep the board where it is.")
    return EXIT_OK


def _check_readable(path: Path) -> None:
    from calibration.overlay import read_image

    try:
        read_image(path, "file")
    except ValueError as e:
        raise UsageError("--image", str(e)) from None


def cmd_drift_check(args: argparse.Namespace) -> int:
    from calibration.drift import DriftReference, DriftReferenceError, check_drift

    try:
        DriftReference.load(args.reference)
    except DriftReferenceError as e:
        raise UsageError("--reference", str(e)) from None
    _check_readable(args.image)
    report = check_drift(args.reference, args.image, camera_file=args.camera_file, max_px=args.max_px,
                         max_mm=args.max_mm, max_deg=args.max_deg)
    print(report.summary())
    if report.passed:
        print("PASS: the camera is where the reference was pinned")
        return EXIT_OK
    advice = ("check with `vla-calibrate overlay`; if the camera moved, re-calibrate (`vla-calibrate handeye`) and "
              "pin a new reference; if only the board moved or the camera file was re-made, pin a new reference")
    if args.override:
        print(f"WARNING: drift check failed and was overridden (--override): {'; '.join(report.problems)}. A policy "
              f"may see the scene differently than in the twin; {advice}", file=sys.stderr)
        return EXIT_OK
    print(f"FAIL: {'; '.join(report.problems)}. {advice[0].upper() + advice[1:]}; or pass --override to go on "
          "anyway", file=sys.stderr)
    return EXIT_OVER_LIMIT


# ---------------------------------------------------------------------------------- self-test
def cmd_selftest(args: argparse.Namespace) -> int:
    import tempfile

    import cv2
    import numpy as np

    from calibration.session import solve_session
    from calibration.synthetic import make_scene, write_synthetic_session
    from calibration.transforms import transform_difference

    print(f"OpenCV {cv2.__version__}")
    worst = 0.0, 0.0
    for name in ("side", "overhead"):
        scene = make_scene(name)
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / name
            write_synthetic_session(folder, scene, np.random.default_rng(args.seed), n=args.samples)
            result = solve_session(folder).hand_eye
        trans_mm, rot_deg = transform_difference(scene.T_cam, result.T_base_from_cam)
        worst = max(worst[0], trans_mm), max(worst[1], rot_deg)
        print(f"{name}: {result.chosen} recovers the camera to {trans_mm:.3f} mm / {rot_deg:.4f} deg")
    ok = worst[0] <= 2.0 and worst[1] <= 0.2
    print(("PASS" if ok else "FAIL") + ": synthetic sessions recovered within 2 mm / 0.2 deg")
    return EXIT_OK if ok else EXIT_FAILED


# ---------------------------------------------------------------------------------- parser
def build_parser() -> argparse.ArgumentParser:
    description, _, epilog = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="vla-calibrate", description=description.replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=epilog)
    sub = p.add_subparsers(dest="command", required=True)

    b = sub.add_parser("board", help="write the ChArUco board as PNG, PDF (true scale) and board.json")
    b.add_argument("--out", type=Path, required=True, help="folder for board.png, board.pdf, board.json")
    default = BoardSpec()
    b.add_argument("--squares-x", type=int, default=default.squares_x, help="squares along x (default: %(default)s)")
    b.add_argument("--squares-y", type=int, default=default.squares_y, help="squares along y (default: %(default)s)")
    b.add_argument("--square-length-mm", type=positive_float, default=default.square_length_m * 1000,
                   help="chessboard square side (default: %(default)s)")
    b.add_argument("--marker-length-mm", type=positive_float, default=default.marker_length_m * 1000,
                   help="ArUco marker side, < square (default: %(default)s)")
    b.add_argument("--dictionary", choices=list(DICTIONARY_SIZES), default=default.dictionary, metavar="NAME",
                   help="OpenCV ArUco dictionary (default: %(default)s)")
    b.add_argument("--dpi", type=positive_float, default=600.0, help="raster resolution (default: %(default)s)")
    b.set_defaults(func=cmd_board)

    i = sub.add_parser("intrinsics", help="camera matrix and distortion from board images")
    i.add_argument("--images", type=existing_dir, required=True, help="folder of board images (one resolution)")
    i.add_argument("--board", type=existing_file, required=True, help="board.json of the printed board")
    i.add_argument("--out", type=Path, default=None, help="intrinsics.json to write (default: print only)")
    i.add_argument("--min-images", type=int_at_least(3), default=6, help="fewest usable images (default: %(default)s)")
    i.add_argument("--max-rms-px", type=positive_float, default=1.0,
                   help="fail above this RMS reprojection error (default: %(default)s)")
    i.add_argument("--accept", action="store_true", help="write the result even above --max-rms-px")
    i.set_defaults(func=cmd_intrinsics)

    h = sub.add_parser("handeye", help="solve a recorded session folder into the camera file, or collect one "
                                       "live first (--robot-ip)")
    h.add_argument("--session", type=existing_dir, default=None,
                   help="solve this recorded session folder (see docs/calibration.md)")
    h.add_argument("--out", type=Path, required=True, help="camera file to write (vla-camera-v1 JSON)")
    live = h.add_argument_group("live collection (eye-to-hand: camera fixed, board on the flange)")
    live.add_argument("--robot-ip", default=None, help="collect live: the robot's control box (FCI), e.g. 172.16.0.2")
    cam = live.add_mutually_exclusive_group()
    cam.add_argument("--camera-serial", default=None, help="the RealSense's serial number")
    cam.add_argument("--playback", type=Path, default=None, help="a RealSense .db3 recording instead of a live camera")
    live.add_argument("--board", type=existing_file, default=None, help="board.json of the board on the flange")
    intr = live.add_mutually_exclusive_group()
    intr.add_argument("--intrinsics", type=existing_file, default=None,
                      help="intrinsics.json (vla-calibrate intrinsics) of the stream; sets the stream's resolution")
    intr.add_argument("--factory-intrinsics", action="store_true",
                      help="use the RealSense's own intrinsics of its 640x480 colour stream (the default)")
    poses = live.add_mutually_exclusive_group()
    poses.add_argument("--poses", type=existing_file, default=None,
                       help="the TCP poses to visit: a JSON list of 4x4 T_base_from_tcp (default: a scripted set)")
    poses.add_argument("--num-poses", type=int_at_least(MIN_SAMPLES), default=None,
                       help=f"size of the scripted pose set (default: {DEFAULT_NUM_POSES})")
    live.add_argument("--camera-position", type=float, nargs=3, default=None, metavar=("X", "Y", "Z"),
                      help="the camera's rough position in the base frame (m): scripted poses keep the board "
                           "facing it")
    live.add_argument("--safety-limits", type=existing_file, default=None,
                      help="the cell's safety limits (YAML/JSON, docs/real_robot.md); default: the conservative "
                           "defaults")
    live.add_argument("--relative-dynamics", type=positive_float, default=None,
                      help=f"the arm's speed scale (default: {DEFAULT_RELATIVE_DYNAMICS:g}, at most the limits' "
                           "max_relative_dynamics_factor)")
    live.add_argument("--ignore-realtime", action="store_true", help="no realtime kernel (a simulated arm only)")
    live.add_argument("--settle-s", type=positive_float, default=None,
                      help="how long the arm must be still before a frame counts (default: 0.5)")
    live.add_argument("--session-dir", type=Path, default=None, help="the new session folder to record into")
    h.add_argument("--method", choices=("auto", *METHODS), default="auto",
                   help="solver whose answer is written; all run and are compared (default: %(default)s, the "
                        "smallest residuals)")
    h.add_argument("--max-trans-mm", type=positive_float, default=DEFAULT_MAX_TRANS_MM,
                   help="fail above this RMS translation residual (default: %(default)s)")
    h.add_argument("--max-rot-deg", type=positive_float, default=DEFAULT_MAX_ROT_DEG,
                   help="fail above this RMS rotation residual (default: %(default)s)")
    h.add_argument("--min-samples", type=int_at_least(3), default=MIN_SAMPLES,
                   help="fewest samples accepted (default: %(default)s)")
    h.add_argument("--accept", action="store_true", help="write the camera file even if the residuals fail")
    h.set_defaults(func=cmd_handeye)

    o = sub.add_parser("overlay", help="render the twin from the camera file over a real frame; robot silhouette "
                                       "offset against a real mask")
    o.add_argument("--camera-file", type=existing_file, required=True, help="the camera file (vla-camera-v1)")
    o.add_argument("--image", type=existing_file, required=True,
                   help="a real frame at the camera file's resolution (or already cropped to --camera-crop)")
    o.add_argument("--out", type=Path, required=True, help="overlay PNG to write; its report goes beside it (.json)")
    o.add_argument("--mode", choices=("edges", "alpha"), default="edges",
                   help="edges: the twin's robot and table outlines in green; alpha: 50/50 (default: %(default)s)")
    o.add_argument("--qpos", type=float, nargs="+", metavar="Q", default=None,
                   help="the real robot's 7 arm joint angles (radians) when the frame was taken "
                        "(default: the twin's rest pose)")
    o.add_argument("--camera-crop", type=crop_box, default=None, metavar="L,T,R,B",
                   help="render only this region, in the camera file's pixels (as the policy sees it)")
    o.add_argument("--real-mask", type=existing_file, default=None,
                   help="the robot's mask in the real frame (PNG, robot > 127): report the silhouette offset and IoU")
    o.set_defaults(func=cmd_overlay)

    d = sub.add_parser("drift", help="pin a reference view of a fixed board; check later frames against it")
    dsub = d.add_subparsers(dest="drift_command", required=True)
    dp = dsub.add_parser("pin", help="store the board's view in a reference folder (right after calibrating)")
    dp.add_argument("--camera-file", type=existing_file, required=True, help="the camera file in use")
    dp.add_argument("--image", type=existing_file, required=True, help="a frame showing the fixed board")
    dp.add_argument("--board", type=existing_file, required=True, help="board.json of the fixed board")
    dp.add_argument("--out", type=Path, required=True, help="the reference folder to write")
    dp.set_defaults(func=cmd_drift_pin)
    dc = dsub.add_parser("check", help="measure the camera's motion since the reference was pinned")
    dc.add_argument("--reference", type=existing_dir, required=True, help="a folder written by `drift pin`")
    dc.add_argument("--image", type=existing_file, required=True, help="a current frame showing the board")
    dc.add_argument("--camera-file", type=existing_file, default=None,
                    help="the camera file in use: fail if it is not the one the reference was pinned with")
    dc.add_argument("--max-px", type=positive_float, default=DRIFT_MAX_PX,
                    help="fail above this mean corner displacement (default: %(default)s)")
    dc.add_argument("--max-mm", type=positive_float, default=DRIFT_MAX_MM,
                    help="fail above this camera translation (default: %(default)s)")
    dc.add_argument("--max-deg", type=positive_float, default=DRIFT_MAX_DEG,
                    help="fail above this camera rotation (default: %(default)s)")
    dc.add_argument("--override", action="store_true", help="on failure, warn and exit 0")
    dc.set_defaults(func=cmd_drift_check)

    s = sub.add_parser("selftest", help="solve rendered sessions with known answers (checks this OpenCV)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--samples", type=int_at_least(5), default=15)
    s.set_defaults(func=cmd_selftest)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except UsageError as e:
        print(f"vla-calibrate {args.command}: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except ValueError as e:  # CalibrationError and malformed data: the message says what and where
        print(f"vla-calibrate {args.command}: calibration failed: {e}", file=sys.stderr)
        return EXIT_FAILED
    except OSError as e:  # a file that cannot be read or written: name it, no traceback
        print(f"vla-calibrate {args.command}: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "),
              file=sys.stderr)
        return EXIT_FAILED


if __name__ == "__main__":
    sys.exit(main())
