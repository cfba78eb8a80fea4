"""Live hand-eye collection: move the arm through a pose set, grab a frame at rest at each pose, and
write a session folder (``session.py``) that ``solve_session`` / ``vla-calibrate handeye --session``
solves.

Eye-to-hand: the camera is fixed, the board rides on the flange. Every motion goes through
``SafetyLayer.send_action`` as capped relative steps (``move_to_pose``), so the cell's safety limits
(box, orientation window, step caps, speed) hold during calibration as they do for a policy, and a
pose outside them is refused before the arm moves.

    poses = calibration_poses(safety.limits, 15, rng=0, camera_position_m=(1.1, -0.4, 0.6))
    folder = collect_session(safety, camera, spec, poses, "calib/session")

The poses recorded are the TCP's (``ArmObservation.T_base_from_tcp``), so the session's
``ee_frame`` is ``"tcp"``; the board may sit anywhere rigid on the flange (the solve estimates
``T_ee_from_board``).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from calibration.errors import BoardNotDetectedError, CalibrationError, TooFewSamplesError
from calibration.files import write_json_atomic
from calibration.hand_eye import MIN_SAMPLES, check_rotation_diversity
from calibration.transforms import check_transform, make_transform, matrix_to_rotvec, rotvec_to_matrix

if TYPE_CHECKING:
    from calibration.session import SessionSpec
    from real_robot.arm import ArmObservation
    from real_robot.camera import Camera, CameraFrame
    from real_robot.safety import SafetyLayer, SafetyLimits

logger = logging.getLogger(__name__)

POSES_FORMAT_HINT = "a JSON list of 4x4 row-major T_base_from_tcp matrices (metres)"
DEFAULT_HALF_EXTENT_M = 0.08
DEFAULT_MARGIN_M = 0.02
DEFAULT_TILT_DEG = (15.0, 30.0)
DEFAULT_MAX_YAW_DEG = 25.0
DEFAULT_MAX_VIEW_ANGLE_DEG = 45.0
ORIENTATION_MARGIN_DEG = 2.0
"""Largest tilt and yaw keep this far inside the target window (the orientation window less the
limits' ``orientation_margin_rad``), each pose at least half of it: the arm comes to rest a fraction
of a degree off a pose, and a pose on the edge would have the layer turn it back."""
MIN_TILT_DEG = 10.0
"""Narrower orientation windows cannot rotate the board enough for hand-eye."""
ACTION_TRANSLATION_MAX_M = 0.1
ACTION_ROTATION_MAX_RAD = 0.095
"""What one normalised twin action can express (0.1 m per axis, 0.1 rad of Euler angles), with a
margin so that ``move_to_pose``'s steps are never clipped as out of range."""
CAP_FRACTION = 0.999
REST_POLL_S = 0.05
PLANNED_POSES_FILE = "planned_poses.json"
"""Written into the session folder: the pose set as ``load_poses`` reads it (to repeat a session)."""


class PoseNotReachedError(CalibrationError):
    """A calibration pose lies outside the safety limits, or the arm did not reach it (or come to
    rest there) in time; the message names the pose and the reason."""


# ----- the pose set -----------------------------------------------------------------------------

def pose_limit_problems(T_base_from_tcp: np.ndarray, limits: SafetyLimits, margin_m: float = 0.0) -> list[str]:
    """Why a TCP pose lies outside the box the safety limits command targets in (``target_box_m``,
    shrunk by ``margin_m`` more) or the window they command orientations in (the orientation window
    less ``orientation_margin_rad``); empty when it is inside both."""
    from real_robot.safety import orientation_excess_rad

    problems = []
    p = np.asarray(T_base_from_tcp, dtype=float)[:3, 3]
    margin = limits.workspace_margin_m + margin_m
    for axis, value, lo, hi in zip("xyz", p, limits.workspace_min_m, limits.workspace_max_m):
        if value < lo + margin:
            problems.append(f"{axis} = {value:.3f} m is below workspace_min_m {lo:.3f}"
                            + (f" + margin {margin:g}" if margin else ""))
        elif value > hi - margin:
            problems.append(f"{axis} = {value:.3f} m is above workspace_max_m {hi:.3f}"
                            + (f" - margin {margin:g}" if margin else ""))
    excess = orientation_excess_rad(np.asarray(T_base_from_tcp, dtype=float)[:3, :3], limits,
                                    limits.orientation_margin_rad)
    if excess > 1e-9:
        problems.append(f"its orientation is {math.degrees(excess):.1f} deg outside the orientation window "
                        f"(max_tilt_rad {limits.max_tilt_rad:g}, max_yaw_rad {limits.max_yaw_rad:g} about "
                        f"reference_quaternion_wxyz, less orientation_margin_rad {limits.orientation_margin_rad:g})")
    return problems


def calibration_poses(limits: SafetyLimits, n: int = 15, rng: np.random.Generator | int | None = 0, *,
                      camera_position_m: Sequence[float] | None = None, centre_m: Sequence[float] | None = None,
                      half_extent_m: float = DEFAULT_HALF_EXTENT_M, margin_m: float = DEFAULT_MARGIN_M,
                      tilt_deg: tuple[float, float] = DEFAULT_TILT_DEG, max_yaw_deg: float = DEFAULT_MAX_YAW_DEG,
                      max_view_angle_deg: float = DEFAULT_MAX_VIEW_ANGLE_DEG, max_tries: int = 200
                      ) -> list[np.ndarray]:
    """A scripted set of TCP poses for an eye-to-hand session, inside the safety limits.

    Positions fill the part of the workspace box around ``centre_m`` (a Latin hypercube: every
    axis is covered evenly), ``margin_m`` inside the box targets are commanded in (``target_box_m``).
    Orientations start from the limits'
    reference orientation (the one the board is mounted to face the camera in) and tilt the TCP's
    z axis by ``tilt_deg`` in directions spread around the circle, plus a yaw about the reference
    z axis: relative rotations about many non-parallel axes, as hand-eye needs. The poses are
    ordered to keep each move short.

    Args:
        limits: the safety limits the poses must respect.
        n: number of poses (>= ``hand_eye.MIN_SAMPLES``; 15-25 recommended).
        rng: randomness (a Generator or a seed; the default seed gives the same set every time).
        camera_position_m: the camera's rough position in the base frame. When given, the board is
            taken to face it at the reference orientation (mount it so) and poses that turn the
            board more than ``max_view_angle_deg`` away from the camera are redrawn.
        centre_m: the centre of the region the poses fill (default: the box's centre).
        half_extent_m: the region reaches this far from the centre on each axis (the board must
            stay in the camera's view).
        margin_m: distance kept from that box's faces.
        tilt_deg: (smallest, largest) tilt of the TCP's z axis from the reference, capped at the
            window's ``max_tilt_rad`` less its ``orientation_margin_rad`` and ``ORIENTATION_MARGIN_DEG``.
        max_yaw_deg: largest yaw about the reference z axis (capped likewise from ``max_yaw_rad``).
        max_view_angle_deg: with ``camera_position_m``: the largest angle between the board's
            normal and the direction to the camera.
        max_tries: draws per pose before giving up.

    Returns:
        ``n`` poses ``T_base_from_tcp`` (4x4, metres), in the order to visit them.

    Raises:
        ValueError: ``n`` too small, or the orientation window too narrow to tilt by
            ``MIN_TILT_DEG``, or no pose facing the camera could be drawn.
        InsufficientRotationError: the set does not rotate enough for hand-eye (narrow limits).
    """
    from real_robot.safety import orientation_excess_rad
    from real_robot.transforms import quaternion_wxyz_to_matrix

    if not isinstance(n, (int, np.integer)) or n < MIN_SAMPLES:
        raise ValueError(f"n={n!r}: hand-eye needs at least {MIN_SAMPLES} poses (15-25 recommended)")
    rng = rng if isinstance(rng, np.random.Generator) else np.random.default_rng(rng)
    lo_box = np.asarray(limits.target_box_m[0]) + margin_m
    hi_box = np.asarray(limits.target_box_m[1]) - margin_m
    mid = 0.5 * (np.asarray(limits.workspace_min_m) + np.asarray(limits.workspace_max_m))
    lo_box, hi_box = np.where(lo_box <= hi_box, lo_box, mid), np.where(lo_box <= hi_box, hi_box, mid)
    centre = mid if centre_m is None else np.clip(np.asarray(centre_m, dtype=float).reshape(3), lo_box, hi_box)
    lo, hi = np.maximum(lo_box, centre - half_extent_m), np.minimum(hi_box, centre + half_extent_m)

    # the target window, in which the safety layer commands orientations
    window_tilt_deg = math.degrees(limits.max_tilt_rad - limits.orientation_margin_rad)
    window_yaw_deg = math.degrees(limits.max_yaw_rad - limits.orientation_margin_rad)
    tilt_max = min(tilt_deg[1], window_tilt_deg - ORIENTATION_MARGIN_DEG)
    if tilt_max < MIN_TILT_DEG:
        raise ValueError(f"the orientation window (max_tilt_rad={limits.max_tilt_rad:g}) allows tilts up to "
                         f"{tilt_max:.1f} deg inside its margins; hand-eye needs >= {MIN_TILT_DEG:g} deg: widen it "
                         "in the safety limits file for the calibration")
    tilt_min = min(tilt_deg[0], tilt_max)
    yaw_max = max(0.0, min(max_yaw_deg, window_yaw_deg - ORIENTATION_MARGIN_DEG))
    inner = replace(limits, orientation_margin_rad=0.0,
                    max_tilt_rad=math.radians(min(window_tilt_deg, tilt_max + 0.5 * ORIENTATION_MARGIN_DEG)),
                    max_yaw_rad=math.radians(min(window_yaw_deg, yaw_max + 0.5 * ORIENTATION_MARGIN_DEG)))
    R_ref = quaternion_wxyz_to_matrix(limits.reference_quaternion_wxyz)
    camera = None if camera_position_m is None else np.asarray(camera_position_m, dtype=float).reshape(3)
    if camera is not None:
        # the board's outward normal in the TCP frame: facing the camera at the reference orientation
        normal_tcp = R_ref.T @ _unit(camera - centre)

    # Latin hypercube: each axis' range cut into n slices, every slice used once
    slices = np.stack([rng.permutation(n) for _ in range(3)], axis=1)
    poses = []
    for k in range(n):
        heading = 2.0 * math.pi * (k + rng.uniform(-0.4, 0.4)) / n
        outside_window = 0  # draws the inner orientation window refused (the rest: not facing the camera)
        for _ in range(max_tries):
            p = lo + (slices[k] + rng.uniform(0.0, 1.0, 3)) / n * (hi - lo)
            tilt = math.radians(rng.uniform(tilt_min, tilt_max))
            # yaw swings twice around the circle of headings: neighbours in the tour turn little
            yaw = math.radians(yaw_max * (0.75 * math.sin(2.0 * heading) + 0.25 * rng.uniform(-1.0, 1.0)))
            axis = R_ref @ np.array([math.cos(heading), math.sin(heading), 0.0])
            R = rotvec_to_matrix(tilt * axis) @ R_ref @ rotvec_to_matrix([0.0, 0.0, yaw])
            if orientation_excess_rad(R, inner) > 0.0:
                outside_window += 1
                continue
            if camera is not None and _angle_deg(R @ normal_tcp, camera - p) > max_view_angle_deg:
                continue
            poses.append(make_transform(R, p))
            break
        else:
            if camera is None or outside_window > max_tries // 2:
                raise ValueError(f"{outside_window} of {max_tries} draws of pose {k + 1} fell outside the orientation "
                                 f"window (max_tilt_rad={limits.max_tilt_rad:g}, max_yaw_rad={limits.max_yaw_rad:g}, "
                                 f"less orientation_margin_rad={limits.orientation_margin_rad:g} and "
                                 f"{0.5 * ORIENTATION_MARGIN_DEG:g} deg): lower tilt_deg or max_yaw_deg, "
                                 "or widen the window in the safety limits file for the calibration")
            raise ValueError(f"no pose within {max_view_angle_deg:g} deg of facing the camera at "
                             f"{np.round(camera, 3).tolist()} after {max_tries} draws: is camera_position_m right "
                             "(base frame, metres)? Lower tilt_deg or raise max_view_angle_deg")
    poses = _short_tour(poses, centre, R_ref, limits)
    check_rotation_diversity(poses)
    return poses


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v)


def _angle_deg(a: np.ndarray, b: np.ndarray) -> float:
    return math.degrees(math.acos(float(np.clip(_unit(a) @ _unit(b), -1.0, 1.0))))


def _step_caps(limits: SafetyLimits) -> tuple[float, float]:
    # a hair below the layer's caps: the action is float32, and a step the layer shortens is a clamp
    return (min(limits.max_translation_per_step_m * CAP_FRACTION, ACTION_TRANSLATION_MAX_M),
            min(limits.max_rotation_per_step_rad * CAP_FRACTION, ACTION_ROTATION_MAX_RAD))


def _steps_between(T_a: np.ndarray, T_b: np.ndarray, caps: tuple[float, float]) -> float:
    """How many capped steps a move takes (translation and rotation go together)."""
    distance_m = float(np.linalg.norm(T_b[:3, 3] - T_a[:3, 3]))
    angle_rad = float(np.linalg.norm(matrix_to_rotvec(T_b[:3, :3] @ T_a[:3, :3].T)))
    return max(distance_m / caps[0], angle_rad / caps[1])


def _short_tour(poses: list[np.ndarray], centre: np.ndarray, R_ref: np.ndarray, limits: SafetyLimits
                ) -> list[np.ndarray]:
    """The poses in nearest-neighbour order from the reference pose at the centre (fewer steps)."""
    caps = _step_caps(limits)
    current, left, tour = make_transform(R_ref, centre), list(poses), []
    while left:
        i = min(range(len(left)), key=lambda j: _steps_between(current, left[j], caps))
        current = left.pop(i)
        tour.append(current)
    return tour


def load_poses(path: str | Path) -> list[np.ndarray]:
    """A pose set from a JSON file: a list of 4x4 row-major ``T_base_from_tcp`` (metres).

    Raises:
        FileNotFoundError: no such file.
        ValueError: not JSON, not a list, or a pose that is not a rigid transform (named by index).
    """
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not valid JSON ({e}); expected {POSES_FORMAT_HINT}") from None
    if not isinstance(data, list) or not data:
        raise ValueError(f"{path} must hold {POSES_FORMAT_HINT}, got {type(data).__name__}")
    return [check_transform(T, f"{path} pose {i}") for i, T in enumerate(data)]


def save_poses(path: str | Path, poses: Sequence[np.ndarray]) -> Path:
    """Write a pose set in the format ``load_poses`` reads."""
    return write_json_atomic(path, [np.round(np.asarray(T, dtype=float), 6).tolist() for T in poses])


# ----- moving -----------------------------------------------------------------------------------

def move_to_pose(safety: SafetyLayer, T_target: np.ndarray, *, tol_m: float = 0.002,
                 tol_rad: float = math.radians(0.5), max_steps: int = 100, gripper_close: bool = True
                 ) -> ArmObservation:
    """Bring the TCP to a pose through the safety layer: relative steps, each computed from the
    measured pose and capped to the limits' per-step caps, sent with ``SafetyLayer.send_action``.

    Args:
        safety: the layer the arm moves through (its limits apply to every step).
        T_target: the TCP pose wanted, ``T_base_from_tcp`` 4x4.
        tol_m, tol_rad: arrived when the measured TCP is this close in position and rotation (the
            recorded pose is the measured one, so the target need not be hit exactly).
        max_steps: give up after this many steps.
        gripper_close: the gripper state sent with every step (closed keeps a board held in the
            fingers; the layer commands the gripper once, with its first step).

    Returns:
        The observation that met the tolerance.

    Raises:
        PoseNotReachedError: the target lies outside the target box or window (nothing
            is sent), or it was not reached within ``max_steps`` (with how far it still is and
            which limits acted).
        MotionError, UnsafeActionError, DeviceNotConnectedError: from the safety layer.
    """
    from real_robot.twin_action import step_to_action

    T_target = check_transform(T_target, "T_target")
    problems = pose_limit_problems(T_target, safety.limits)
    if problems:
        raise PoseNotReachedError(f"target pose at {np.round(T_target[:3, 3], 3).tolist()} m is outside the safety "
                                  f"limits: {'; '.join(problems)}. The layer would clamp every step toward it; "
                                  "move the pose inside the limits or widen the limits file")
    cap_m, cap_rad = _step_caps(safety.limits)
    clamps: set[str] = set()
    for step in range(max_steps + 1):
        obs = safety.observation()
        T = obs.T_base_from_tcp
        translation = T_target[:3, 3] - T[:3, 3]
        rotvec = matrix_to_rotvec(T_target[:3, :3] @ T[:3, :3].T)  # base-aligned, about the TCP
        distance_m, angle_rad = float(np.linalg.norm(translation)), float(np.linalg.norm(rotvec))
        if distance_m <= tol_m and angle_rad <= tol_rad:
            return obs
        if step == max_steps:
            break
        scale = min(1.0, cap_m / max(distance_m, 1e-12), cap_rad / max(angle_rad, 1e-12))
        sent = safety.send_action(step_to_action(scale * translation, rotvec_to_matrix(scale * rotvec),
                                                 gripper_close))
        clamps.update(sent.clamps)
    acted = f"; limits that acted: {', '.join(sorted(clamps))}" if clamps else ""
    raise PoseNotReachedError(f"the TCP did not reach {np.round(T_target[:3, 3], 3).tolist()} m within "
                              f"max_steps={max_steps} steps: still {distance_m * 1000:.1f} mm and "
                              f"{math.degrees(angle_rad):.2f} deg away{acted}")


class _Holder:
    """Sends zero steps while the arm waits at a pose, so that the layer's watchdog (which stops an
    arm no action follows) sees the calibration in control."""

    def __init__(self, safety: SafetyLayer, gripper_close: bool):
        self.safety, self.gripper_close = safety, gripper_close
        self.every_s = safety.limits.watchdog_timeout_s / 3.0
        self.last_s = time.monotonic()

    def __call__(self) -> None:
        from real_robot.twin_action import step_to_action

        if time.monotonic() - self.last_s >= self.every_s:
            self.safety.send_action(step_to_action(np.zeros(3), np.eye(3), self.gripper_close))
            self.last_s = time.monotonic()


def _moved(T_a: np.ndarray, T_b: np.ndarray) -> tuple[float, float]:
    return (float(np.linalg.norm(T_a[:3, 3] - T_b[:3, 3])),
            float(np.linalg.norm(matrix_to_rotvec(T_a[:3, :3] @ T_b[:3, :3].T))))


def wait_until_at_rest(safety: SafetyLayer, settle_s: float, *, tol_m: float = 1e-4,
                       tol_rad: float = math.radians(0.03), timeout_s: float = 10.0,
                       hold: Callable[[], None] | None = None) -> tuple[ArmObservation, float]:
    """Wait until the TCP has stayed within ``tol_m`` / ``tol_rad`` of one pose for ``settle_s``.

    Returns:
        ``(observation, rest_s)``: the last reading and the ``time.monotonic()`` it confirmed rest.

    Raises:
        PoseNotReachedError: still moving after ``timeout_s``.
    """
    start_s = time.monotonic()
    anchor = safety.observation()
    anchor_s = start_s
    while True:
        time.sleep(REST_POLL_S)
        if hold is not None:
            hold()
        obs = safety.observation()
        now_s = time.monotonic()
        distance_m, angle_rad = _moved(obs.T_base_from_tcp, anchor.T_base_from_tcp)
        if distance_m > tol_m or angle_rad > tol_rad:
            anchor, anchor_s = obs, now_s
        elif now_s - anchor_s >= settle_s:
            return obs, now_s
        if now_s - start_s > timeout_s:
            raise PoseNotReachedError(f"the arm did not come to rest within {timeout_s:g} s (still moving "
                                      f"{distance_m * 1000:.2f} mm / {math.degrees(angle_rad):.3f} deg within "
                                      f"{REST_POLL_S:g} s)")


def _frame_after(camera: Camera, after_s: float, timeout_ms: float, hold: Callable[[], None]) -> CameraFrame:
    """The first frame that reached this process after ``after_s`` (earlier ones may show motion)."""
    from real_robot.errors import StaleFrameError

    deadline_s = time.monotonic() + timeout_ms / 1000.0
    while True:
        remaining_ms = (deadline_s - time.monotonic()) * 1000.0
        if remaining_ms <= 0:
            raise StaleFrameError(f"{camera}: no frame within {timeout_ms:g} ms after the arm came to rest")
        try:
            frame = camera.read(timeout_ms=min(remaining_ms, 200.0))
        except StaleFrameError:
            hold()
            continue
        hold()
        if frame.received_s >= after_s:
            return frame


def _to_bgr(image: np.ndarray) -> np.ndarray:
    import cv2

    image = np.asarray(image)
    return cv2.cvtColor(image, cv2.COLOR_RGB2BGR) if image.ndim == 3 and image.shape[2] == 3 else image


# ----- the session --------------------------------------------------------------------------------

def collect_session(safety: SafetyLayer, camera: Camera, spec: SessionSpec, poses: Sequence[np.ndarray],
                    folder: str | Path, settle_s: float = 0.5, *, min_samples: int = MIN_SAMPLES,
                    tol_m: float = 0.002, tol_rad: float = math.radians(0.5), max_steps: int = 100,
                    rest_tol_m: float = 1e-4, rest_tol_rad: float = math.radians(0.03), rest_timeout_s: float = 10.0,
                    frame_timeout_ms: float = 3000.0, gripper_close: bool = True,
                    report: Callable[[str], None] | None = None) -> Path:
    """Record a session: at each pose, move there, wait for rest, grab a fresh frame, record it with
    the measured TCP pose.

    A pose whose frame shows no board is skipped and reported (its frame is kept in
    ``skipped/NNN.png`` for a look); samples are named by their pose's index. The folder is a
    normal session folder (``session.json``, ``images/``, ``poses/``), solved offline by
    ``solve_session``. Each pose file also records the target and the joint positions, and
    ``planned_poses.json`` the whole pose set (``--poses`` repeats it).

    Args:
        safety: the connected arm's safety layer (not in dry-run mode: calibration moves the arm).
        camera: the connected camera (RGB frames at the intrinsics' resolution).
        spec: the session's mode, board and intrinsics; ``ee_frame`` must be ``"tcp"``.
        poses: the TCP poses to visit, ``T_base_from_tcp`` (``calibration_poses``, ``load_poses``).
        folder: a new session folder.
        settle_s: the TCP must stay within ``rest_tol_m`` / ``rest_tol_rad`` this long before a frame
            counts (no motion blur, no pose lag); frames that arrived earlier are dropped.
        min_samples: fail as soon as fewer poses than this can still give a sample.
        tol_m, tol_rad, max_steps, gripper_close: as ``move_to_pose``.
        rest_tol_m, rest_tol_rad, rest_timeout_s: as ``wait_until_at_rest``.
        frame_timeout_ms: wait this long for a fresh frame.
        report: called with one line per pose (default: the module's logger).

    Returns:
        The session folder.

    Raises:
        ValueError: dry-run limits, an ``ee_frame`` other than ``"tcp"``, or frames of another size
            than the intrinsics' (checked before the arm moves).
        PoseNotReachedError: a pose outside the limits (checked before the arm moves, all named),
            or one the arm did not reach or rest at.
        TooFewSamplesError: fewer than ``min_samples`` poses are or can still be recorded.
        FileExistsError: the folder already holds a session.
        MotionError, StaleFrameError, DeviceNotConnectedError: from the devices.
    """
    from calibration.detection import detect_board
    from calibration.session import add_sample, create_session

    say = report or logger.info
    if safety.limits.dry_run:
        raise ValueError("the safety limits are in dry-run mode (dry_run: true): calibration must move the arm; "
                         "use limits with dry_run false")
    if spec.ee_frame != "tcp":
        raise ValueError(f"spec.ee_frame is {spec.ee_frame!r}: the poses recorded are T_base_from_tcp, so the "
                         "session's ee_frame must be 'tcp'")
    poses = [check_transform(T, f"pose {i}") for i, T in enumerate(poses)]
    outside = [f"pose {i}: {'; '.join(problems)}" for i, problems in
               enumerate(pose_limit_problems(T, safety.limits) for T in poses) if problems]
    if outside:
        raise PoseNotReachedError("poses outside the safety limits (nothing was moved): " + " | ".join(outside))
    if len(poses) < min_samples:
        raise TooFewSamplesError(f"{len(poses)} poses given; hand-eye needs >= {min_samples} (15-25 recommended)")
    first = camera.read(timeout_ms=frame_timeout_ms)
    size = (spec.intrinsics.width, spec.intrinsics.height)
    if (first.image.shape[1], first.image.shape[0]) != size:
        raise ValueError(f"{camera} sends {first.image.shape[1]}x{first.image.shape[0]} frames but the intrinsics "
                         f"are for {size[0]}x{size[1]}: use the stream and resolution the intrinsics belong to")
    folder = create_session(folder, spec)
    save_poses(folder / PLANNED_POSES_FILE, poses)

    hold = _Holder(safety, gripper_close)
    kept: list[str] = []
    skipped: dict[str, str] = {}
    for i, T_target in enumerate(poses):
        name = f"{i:03d}"
        move_to_pose(safety, T_target, tol_m=tol_m, tol_rad=tol_rad, max_steps=max_steps,
                     gripper_close=gripper_close)
        hold.last_s = time.monotonic()  # the last step just went out
        for _ in range(3):  # a frame counts only if the arm stayed at rest around it
            before, rest_s = wait_until_at_rest(safety, settle_s, tol_m=rest_tol_m, tol_rad=rest_tol_rad,
                                                timeout_s=rest_timeout_s, hold=hold)
            frame = _frame_after(camera, rest_s, frame_timeout_ms, hold)
            after = safety.observation()
            distance_m, angle_rad = _moved(after.T_base_from_tcp, before.T_base_from_tcp)
            if distance_m <= rest_tol_m and angle_rad <= rest_tol_rad:
                break
        else:
            raise PoseNotReachedError(f"pose {name}: the arm kept moving while frames were taken "
                                      f"({distance_m * 1000:.2f} mm / {math.degrees(angle_rad):.3f} deg)")
        image = _to_bgr(frame.image)
        try:
            board = detect_board(image, spec.board, f"the frame at pose {name}")
        except BoardNotDetectedError as e:
            skipped[name] = str(e)
            (folder / "skipped").mkdir(exist_ok=True)
            _write_image(folder / "skipped" / f"{name}.png", image)
            say(f"pose {i + 1}/{len(poses)}: skipped, {e}")
        else:
            add_sample(folder, i, image, after.T_base_from_tcp,
                       extra={"pose_index": i, "T_base_from_tcp_target": np.round(T_target, 6).tolist(),
                              "joint_positions_rad": after.joint_positions_rad.tolist(),
                              "frame_number": int(frame.frame_number)})
            kept.append(name)
            say(f"pose {i + 1}/{len(poses)}: sample {name}, {len(board.ids)} board corners")
        possible = len(kept) + len(poses) - 1 - i
        if possible < min_samples:
            raise TooFewSamplesError(
                f"the board was detected at {len(kept)} of {i + 1} poses so far ({len(poses) - 1 - i} left), fewer "
                f"than the {min_samples} samples hand-eye needs. Skipped: "
                + "; ".join(f"{n}: {why}" for n, why in skipped.items())
                + f". Frames are in {folder / 'skipped'}: is the board in the camera's view at these poses (mount it "
                  "facing the camera at the reference orientation; give the camera's position), lit and sharp?")
    if skipped:
        say(f"{len(skipped)} of {len(poses)} poses skipped (board not detected): {', '.join(skipped)}")
    return folder


def _write_image(path: Path, image: np.ndarray) -> None:
    import cv2

    if not cv2.imwrite(str(path), image):
        raise OSError(f"could not write {path}")
