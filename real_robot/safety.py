"""The safety layer between a policy and an ``Arm``: the only way commands reach the arm.

``SafetyLayer.send_action`` takes one normalised twin action ``[7]`` (``real_robot.twin_action``),
refuses NaN / inf (stops the arm, sends nothing, raises), limits the step to the per-step caps, the
workspace box and the orientation window, rate-limits gripper changes, sends it (or only logs it in
dry-run mode) and returns what was really sent. Every clamp is counted by kind for episode info. A
watchdog thread stops the arm when no action follows within ``watchdog_timeout_s``. A stop wins
over an action being sent at the same moment (from another thread): what that action had not yet
sent is not sent (``SentCommand.preempted``). In dry-run mode nothing reaches the arm, stops included.

The step limiting is a pure function (``limit_step``) of the step, the current TCP pose and the
limits: the guarantees below are properties of that function.

- A step never exceeds ``max_translation_per_step_m`` (norm) or ``max_rotation_per_step_rad``.
- The commanded TCP position always lies in the box shrunk by ``workspace_margin_m`` (the target
  box), so the measured TCP, which passes a target by the arm's tracking error when it brakes at a
  face, stays in the box itself. A TCP measured outside the target box is brought back by up to one
  capped step per action, whatever the action: a target that only held it there would let each
  overshoot start from further out.
- Likewise for the orientation window (tilt of the TCP's z axis from the reference orientation, and
  yaw about the reference z axis), each limit on its own: every commanded orientation lies in the
  window shrunk by ``orientation_margin_rad`` (the target window), and an orientation measured
  outside it is first turned back toward it by up to one capped step; no limit's excess ever grows.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from real_robot.config_file import read_mapping_file
from real_robot.errors import MotionError, UnsafeActionError
from real_robot.lifecycle import deferred_interrupts

if TYPE_CHECKING:
    import numpy as np

    from real_robot.arm import Arm, ArmObservation

logger = logging.getLogger(__name__)

CLAMP_KINDS = ("action_range", "translation_cap", "workspace", "rotation_cap", "orientation", "gripper_rate",
               "step_rate", "non_finite", "watchdog")
"""Every kind ``SafetyLayer.clamp_counts`` counts."""
ZERO_STEP_M = 1e-5
ZERO_STEP_RAD = 1e-5
"""A step smaller than both is no motion: the layer sends no target (the gripper still changes)."""

FRANKA_HOME_JOINT_POSITIONS_RAD = (0.0, -math.pi / 4, 0.0, -3 * math.pi / 4, 0.0, math.pi / 2, math.pi / 4)
FRANKA_JOINT_LIMITS_RAD = ((-2.8973, -1.7837, -2.9007, -3.0718, -2.8973, -0.0175, -3.0159),
                           (2.8973, 1.7837, 2.9007, -0.0698, 2.8973, 4.5169, 3.0159))
"""``(lower, upper)`` joint positions a Panda or an FR3 allows (the wider of the two per joint; the
robot enforces its own): a home outside them was written in degrees or for another arm."""
FRANKA_REACH_M = 0.855
"""How far from its base a Franka's TCP reaches; a workspace corner far beyond it was written in
millimetres or in another frame."""


@dataclass(kw_only=True)
class SafetyLimits:
    """What the safety layer allows. The defaults are deliberately slow and small: widen them per
    cell, after a dry run, in a file loaded with ``SafetyLimits.from_file``."""

    workspace_min_m: tuple[float, float, float] = (0.28, -0.30, 0.10)
    """Lower corner of the box the TCP stays in (robot base frame, m). Measure it on the cell."""
    workspace_max_m: tuple[float, float, float] = (0.70, 0.30, 0.55)
    """Upper corner of that box (m)."""
    workspace_margin_m: float = 0.01
    """How far inside the box every commanded TCP position stays. Braking at a face, the arm's tracking
    carries the measured TCP past its target: franky-sim at dynamics factor 0.2, over 10,000 fuzzed
    chunks, by up to 4.2 mm. In [0, half the box's narrowest side); raise it with the dynamics factor."""
    reference_quaternion_wxyz: tuple[float, float, float, float] = (0.0, 1.0, 0.0, 0.0)
    """Centre of the orientation window: the TCP pointing down, its x axis along the base's x."""
    max_tilt_rad: float = 0.6
    """Largest angle between the TCP's z axis and the reference's z axis, in (0, pi/2)."""
    max_yaw_rad: float = 1.6
    """Largest rotation about the reference's z axis (either way), in (0, pi]."""
    orientation_margin_rad: float = 0.05
    """How far inside the window (each limit: tilt and yaw) every commanded orientation stays (the target
    window). Braking from a turn, the arm's tracking carries the measured orientation past its target as
    it does the position: franky-sim at dynamics factor 0.2, in fuzzed chunks, by up to 1.6 deg. In [0,
    the smaller of max_tilt_rad and max_yaw_rad); raise it with the dynamics factor."""
    max_translation_per_step_m: float = 0.02
    """Largest TCP displacement of one step (norm)."""
    max_rotation_per_step_rad: float = 0.05
    """Largest TCP rotation of one step (angle)."""
    max_relative_dynamics_factor: float = 0.2
    """Largest speed scale (fraction of the arm's max velocity, acceleration and jerk) the layer accepts
    an arm configured with, in (0, 1]."""
    gripper_min_interval_s: float = 1.0
    """Least time between two gripper state changes; faster flips are held (counted as gripper_rate)."""
    min_step_interval_s: float = 0.02
    """Least time between two arm steps; a step sent sooner waits (counted as step_rate). franky's
    planner, given a new target every 2 ms, carried the TCP 5 cm past a box face it was never sent
    beyond; at 50 Hz (10 times the twin's 5 Hz) within a few mm (``workspace_margin_m``). In [0, 1)."""
    watchdog_timeout_s: float = 1.0
    """Stop the arm when no action follows the last one within this long."""
    dry_run: bool = False
    """Log every command instead of sending it: the arm is read, never moved."""
    home_joint_positions_rad: tuple[float, ...] = FRANKA_HOME_JOINT_POSITIONS_RAD
    """Where ``SafetyLayer.home()`` moves the arm (joint space, 7 values)."""

    def __post_init__(self) -> None:
        self.workspace_min_m = _floats("workspace_min_m", self.workspace_min_m, 3)
        self.workspace_max_m = _floats("workspace_max_m", self.workspace_max_m, 3)
        for name in ("workspace_min_m", "workspace_max_m"):
            if max(abs(v) for v in getattr(self, name)) > FRANKA_REACH_M + 0.3:
                raise ValueError(f"{name}={getattr(self, name)}: metres in the robot base frame, each within "
                                 f"{FRANKA_REACH_M + 0.3:g} m of the base (a Franka reaches {FRANKA_REACH_M} m); "
                                 "millimetres, or another frame?")
        for axis, lo, hi in zip("xyz", self.workspace_min_m, self.workspace_max_m):
            if not lo < hi:
                raise ValueError(f"workspace_min_m/workspace_max_m: the {axis} range [{lo}, {hi}] is empty; "
                                 f"each min must be below its max")
        narrowest = min(hi - lo for lo, hi in zip(self.workspace_min_m, self.workspace_max_m))
        margin = self.workspace_margin_m
        if isinstance(margin, bool) or not (isinstance(margin, (int, float)) and 0.0 <= margin < narrowest / 2):
            raise ValueError(f"workspace_margin_m={margin!r}: metres in [0, {narrowest / 2:g}) (half the box's "
                             "narrowest side: the box it leaves for targets must not be empty)")
        q = _floats("reference_quaternion_wxyz", self.reference_quaternion_wxyz, 4)
        norm = math.sqrt(sum(v * v for v in q))
        if abs(norm - 1.0) > 1e-3:
            raise ValueError(f"reference_quaternion_wxyz={q}: a unit quaternion (w, x, y, z), norm 1 (got {norm:.4f})")
        self.reference_quaternion_wxyz = tuple(v / norm for v in q)
        _in_range("max_tilt_rad", self.max_tilt_rad, 0.0, math.pi / 2, hi_closed=False)
        _in_range("max_yaw_rad", self.max_yaw_rad, 0.0, math.pi)
        margin = self.orientation_margin_rad
        narrowest = min(self.max_tilt_rad, self.max_yaw_rad)
        if isinstance(margin, bool) or not (isinstance(margin, (int, float)) and 0.0 <= margin < narrowest):
            raise ValueError(f"orientation_margin_rad={margin!r}: radians in [0, {narrowest:g}) (the smaller of "
                             "max_tilt_rad and max_yaw_rad: the window it leaves for targets must not be empty)")
        _in_range("max_translation_per_step_m", self.max_translation_per_step_m, 0.0, 0.2)
        _in_range("max_rotation_per_step_rad", self.max_rotation_per_step_rad, 0.0, 1.0)
        _in_range("max_relative_dynamics_factor", self.max_relative_dynamics_factor, 0.0, 1.0)
        _in_range("watchdog_timeout_s", self.watchdog_timeout_s, 0.0, 60.0)
        for name, hi in (("gripper_min_interval_s", 60.0), ("min_step_interval_s", 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not (isinstance(value, (int, float)) and 0.0 <= value < hi):
                raise ValueError(f"{name}={value!r}: seconds in [0, {hi:g})")
        if not isinstance(self.dry_run, bool):
            raise ValueError(f"dry_run={self.dry_run!r}: true or false")
        self.home_joint_positions_rad = _floats("home_joint_positions_rad", self.home_joint_positions_rad, 7)
        lower, upper = FRANKA_JOINT_LIMITS_RAD
        outside = [i + 1 for i, (lo, v, hi) in enumerate(zip(lower, self.home_joint_positions_rad, upper))
                   if not lo <= v <= hi]
        if outside:
            raise ValueError(f"home_joint_positions_rad={self.home_joint_positions_rad}: joint(s) {outside} outside a "
                             f"Franka's limits (radians; lower {lower}, upper {upper}); degrees?")

    @property
    def target_box_m(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        """``(min, max)`` corners of the box commanded TCP positions lie in: the workspace box shrunk
        by ``workspace_margin_m``."""
        m = self.workspace_margin_m
        return tuple(v + m for v in self.workspace_min_m), tuple(v - m for v in self.workspace_max_m)

    @classmethod
    def from_file(cls, path: str | Path) -> "SafetyLimits":
        """Load limits from a YAML (``.yaml``/``.yml``) or JSON (``.json``) mapping; absent keys keep
        their defaults.

        Raises:
            ValueError: an unknown key (the message lists the allowed ones), a bad value, another
                file type, a folder, or a file that is not a YAML/JSON mapping.
            FileNotFoundError: no such file.
        """
        path = Path(path)
        if path.suffix not in (".yaml", ".yml", ".json") and not path.is_dir():
            raise ValueError(f"{path}: safety limits are read from .yaml, .yml or .json files")
        data = read_mapping_file(path, "limit names to values")
        allowed = [f.name for f in fields(cls)]
        unknown = sorted(set(data) - set(allowed), key=str)
        if unknown:
            raise ValueError(f"{path}: unknown safety limit(s) {unknown}; allowed: {allowed}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})


def _floats(name: str, value: Any, n: int) -> tuple[float, ...]:
    try:
        if isinstance(value, (str, bytes)) or any(isinstance(v, (str, bytes, bool)) for v in value):
            raise TypeError  # a string would be read character by character, "0.5" as a number
        out = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={value!r}: {n} numbers") from None
    if len(out) != n or not all(math.isfinite(v) for v in out):
        raise ValueError(f"{name}={value!r}: {n} finite numbers")
    return out


def _in_range(name: str, value: Any, lo: float, hi: float, hi_closed: bool = True) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and lo < value and (
        value <= hi if hi_closed else value < hi)
    if not ok:
        raise ValueError(f"{name}={value!r}: a number in ({lo:g}, {hi:g}{']' if hi_closed else ')'}")


# ----- the pure step limiter -------------------------------------------------------------------

def _tilt_and_yaw_rad(R_base_from_tcp: Any, limits: SafetyLimits) -> tuple[float, float]:
    """The tilt (angle of the TCP's z axis from the reference's, in [0, pi]) and the signed yaw (the TCP
    x axis' heading about the reference's z axis, well defined while the tilt is below pi/2)."""
    import numpy as np

    from real_robot.transforms import quaternion_wxyz_to_matrix

    R_ref_from_tcp = quaternion_wxyz_to_matrix(limits.reference_quaternion_wxyz).T @ np.asarray(R_base_from_tcp)
    tilt = math.acos(max(-1.0, min(1.0, float(R_ref_from_tcp[2, 2]))))
    return tilt, math.atan2(float(R_ref_from_tcp[1, 0]), float(R_ref_from_tcp[0, 0]))


def orientation_excesses_rad(R_base_from_tcp: Any, limits: SafetyLimits,
                             margin_rad: float = 0.0) -> tuple[float, float]:
    """How far (rad) an orientation lies outside the window shrunk by ``margin_rad``, per limit, 0
    within it: the tilt excess (TCP z axis vs the reference's) and the yaw excess (about the
    reference's z axis). ``margin_rad=limits.orientation_margin_rad`` measures against the target
    window commands are kept in."""
    tilt, yaw = _tilt_and_yaw_rad(R_base_from_tcp, limits)
    return max(0.0, tilt - (limits.max_tilt_rad - margin_rad)), max(0.0, abs(yaw) - (limits.max_yaw_rad - margin_rad))


def orientation_excess_rad(R_base_from_tcp: Any, limits: SafetyLimits, margin_rad: float = 0.0) -> float:
    """How far (rad) an orientation lies outside the window (shrunk by ``margin_rad``); 0 inside: the
    larger of ``orientation_excesses_rad``."""
    return max(orientation_excesses_rad(R_base_from_tcp, limits, margin_rad))


def _turn_back_into_window(R: Any, limits: SafetyLimits) -> Any:
    """The rotation (rotvec, base frame, at most one capped step) that brings an orientation outside
    the target window back toward it, each limit on its own so that neither excess grows. With
    ``R_ref_from_tcp = Rz(yaw) Ry(pitch) Rx(roll)``: the tilt first, by scaling pitch and roll down
    together (the yaw stays), then the yaw, about the reference's z axis (the tilt stays), with what
    the step has left. Zero inside the target window."""
    import numpy as np

    from real_robot.transforms import matrix_to_rotvec, quaternion_wxyz_to_matrix, rotation_angle, rotvec_to_matrix

    margin, budget = limits.orientation_margin_rad, limits.max_rotation_per_step_rad
    if orientation_excess_rad(R, limits, margin) == 0.0:
        return np.zeros(3)
    R_ref = quaternion_wxyz_to_matrix(limits.reference_quaternion_wxyz)
    M = R_ref.T @ np.asarray(R)
    yaw = math.atan2(M[1, 0], M[0, 0])
    pitch = math.asin(max(-1.0, min(1.0, -float(M[2, 0]))))
    roll = math.atan2(M[2, 1], M[2, 2])

    def swing(k: float) -> Any:  # Ry(k pitch) Rx(k roll): tilt 0 at k = 0, the present one at k = 1
        return rotvec_to_matrix([0.0, k * pitch, 0.0]) @ rotvec_to_matrix([k * roll, 0.0, 0.0])

    def tilt(k: float) -> float:
        return math.acos(max(-1.0, min(1.0, float(swing(k)[2, 2]))))

    now = swing(1.0)
    # down to the target window's edge (at k = 0 the tilt is 0), as far as one step turns
    k = _largest(lambda k: tilt(k) <= limits.max_tilt_rad - margin, 1.0)
    k = 1.0 - _largest(lambda d: rotation_angle(swing(1.0 - d) @ now.T) <= budget, 1.0 - k)
    to_frame = R_ref @ rotvec_to_matrix([0.0, 0.0, yaw])
    turn = to_frame @ swing(k) @ now.T @ to_frame.T
    left = max(0.0, budget - rotation_angle(turn))
    max_yaw = limits.max_yaw_rad - margin
    yaw_back = max(-left, min(left, max(-max_yaw, min(max_yaw, yaw)) - yaw))
    return matrix_to_rotvec(rotvec_to_matrix(yaw_back * R_ref[:, 2]) @ turn)


def _largest(good: Callable[[float], bool], hi: float) -> float:
    """The largest ``x`` in [0, hi] (by bisection, to ``hi`` / 2**40) with ``good(x)``, where ``good(0)``
    holds: the fallback."""
    if good(hi):
        return hi
    lo = 0.0
    for _ in range(40):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if good(mid) else (lo, mid)
    return lo


def _largest_fraction(rotvec: Any, R: Any, limits: SafetyLimits, allowed: list[float]) -> float:
    """The largest ``s`` in [0, 1] for which turning ``R`` by ``s * rotvec`` leaves no limit's excess
    over the target window above its ``allowed``; 0 (no rotation) is the fallback."""
    from real_robot.transforms import rotvec_to_matrix

    def keeps_window(s: float) -> bool:
        excesses = orientation_excesses_rad(rotvec_to_matrix(s * rotvec) @ R, limits, limits.orientation_margin_rad)
        return all(e <= a for e, a in zip(excesses, allowed))

    return _largest(keeps_window, 1.0)


def limit_step(translation_m: Any, R_delta: Any, T_base_from_tcp: Any,
               limits: SafetyLimits) -> tuple[Any, Any, list[str]]:
    """Limit one relative step to the caps, the workspace box and the orientation window.

    Args:
        translation_m: ``[3]`` wanted TCP displacement, base frame.
        R_delta: ``[3, 3]`` wanted rotation, base-aligned, about the TCP (new R = R_delta @ R).
        T_base_from_tcp: ``[4, 4]`` the TCP pose now.
        limits: the limits.

    Returns:
        ``(translation_m [3], R_delta [3, 3], clamps)``: the step to send and the kinds clamped.
    """
    import numpy as np

    from real_robot.transforms import matrix_to_rotvec, rotvec_to_matrix

    clamps: list[str] = []
    t = np.array(translation_m, dtype=np.float64).reshape(3)
    p = np.asarray(T_base_from_tcp, dtype=np.float64)[:3, 3]
    R = np.asarray(T_base_from_tcp, dtype=np.float64)[:3, :3]

    cap = limits.max_translation_per_step_m * (1 + 1e-6)  # not for float noise (float32 0.2 * 0.1 > 0.02)
    norm = float(np.linalg.norm(t))
    if norm > cap:
        t *= limits.max_translation_per_step_m / norm
        clamps.append("translation_cap")
    target = np.clip(p + t, *limits.target_box_m)
    if np.any(target != p + t):
        clamps.append("workspace")
    t = target - p
    # From inside, clipping moves the target toward p and never lengthens t. From outside, it may:
    # shorten it along its own direction, which still leads back toward the box on every axis.
    norm = float(np.linalg.norm(t))
    if norm > cap:
        t *= limits.max_translation_per_step_m / norm
        if "translation_cap" not in clamps:
            clamps.append("translation_cap")

    rotvec = matrix_to_rotvec(R_delta)
    angle = float(np.linalg.norm(rotvec))
    if angle > limits.max_rotation_per_step_rad * (1 + 1e-6):
        rotvec *= limits.max_rotation_per_step_rad / angle
        angle = limits.max_rotation_per_step_rad
        clamps.append("rotation_cap")
    # Each limit on its own, against the target window: measured outside it (the arm's tracking carried
    # it past a target), turn back first, as a target that only held it there would let each overshoot
    # start from further out; the wanted rotation gets what the step has left. No excess ever grows.
    margin = limits.orientation_margin_rad
    excesses = orientation_excesses_rad(R, limits, margin)
    back = _turn_back_into_window(R, limits)
    back *= _largest_fraction(back, R, limits, [e + 1e-9 for e in excesses])
    back_angle = float(np.linalg.norm(back))
    R_start = rotvec_to_matrix(back) @ R
    room = max(0.0, limits.max_rotation_per_step_rad - back_angle)
    shrink = min(1.0, room / angle) if angle > 0.0 else 1.0
    s = _largest_fraction(shrink * rotvec, R_start, limits,
                          [e + 1e-9 for e in orientation_excesses_rad(R_start, limits, margin)])
    if back_angle > 0.0 or s * shrink < 1.0:
        clamps.append("orientation")
    return t, rotvec_to_matrix(s * shrink * rotvec) @ rotvec_to_matrix(back), clamps


# ----- the watchdog --------------------------------------------------------------------------

class Watchdog:
    """Calls ``on_timeout`` once when ``kick()`` is not called again within ``timeout_s``.

    Disarmed until the first ``kick()``; fires once per silence (then disarmed until the next kick).
    """

    def __init__(self, timeout_s: float, on_timeout: Callable[[], None], name: str = "safety-watchdog"):
        self.timeout_s = float(timeout_s)
        self._on_timeout = on_timeout
        self._cond = threading.Condition()
        self._deadline_s: float | None = None
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def kick(self) -> None:
        """Arm (or re-arm) the deadline: ``timeout_s`` from now."""
        with self._cond:
            self._deadline_s = time.monotonic() + self.timeout_s
            self._cond.notify()

    @property
    def armed(self) -> bool:
        """Whether a deadline is running (a ``kick()`` came after the last firing or ``disarm()``)."""
        with self._cond:
            return self._deadline_s is not None

    def disarm(self) -> None:
        """No deadline until the next ``kick()``."""
        with self._cond:
            self._deadline_s = None
            self._cond.notify()

    def close(self) -> None:
        """End the thread (waits for it)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._closed:
                    if self._deadline_s is None:
                        self._cond.wait()
                        continue
                    remaining = self._deadline_s - time.monotonic()
                    if remaining <= 0:
                        break
                    self._cond.wait(remaining)
                if self._closed:
                    return
                self._deadline_s = None
            try:
                self._on_timeout()
            except Exception:  # a failing stop must not kill the thread that would stop the next time
                logger.exception("the watchdog's stop failed")


# ----- the layer ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class SentCommand:
    """What ``SafetyLayer.send_action`` really sent (or, in dry-run mode, would have sent)."""

    action: "np.ndarray"
    """The normalised twin action ``[7]`` of the step sent (float32; gripper -1 open / +1 close)."""
    translation_m: "np.ndarray"
    """``[3]`` TCP displacement, base frame."""
    rotation_rotvec_rad: "np.ndarray"
    """``[3]`` rotation about the TCP, base-aligned axes."""
    gripper_close: bool
    """The gripper state after this step."""
    gripper_changed: bool
    """Whether a gripper command was sent."""
    T_base_from_tcp_target: "np.ndarray"
    """``[4, 4]`` the TCP pose this step aims at."""
    clamps: tuple[str, ...] = field(default=())
    """The kinds of limit that changed this step (empty: sent as asked)."""
    dry_run: bool = False
    """True: nothing reached the arm."""
    preempted: bool = False
    """True: a stop arrived while this action was being sent, and won: the arm was stopped and what
    had not been sent yet was not (no motion when the stop came first, else no gripper change)."""


class SafetyLayer:
    """The one path from a policy to an ``Arm``.

    Example:
        >>> with FrankyArm(FrankyArmConfig(robot_ip="172.16.0.2")) as arm:   # doctest: +SKIP
        ...     with SafetyLayer(arm, SafetyLimits.from_file("cell_limits.yaml")) as safe:
        ...         safe.home()
        ...         sent = safe.send_action(policy(obs))
    """

    def __init__(self, arm: "Arm", limits: SafetyLimits):
        """
        Args:
            arm: the arm; from now on its motion commands need this layer's permit.
            limits: what is allowed.

        Raises:
            ValueError: the arm is configured faster than ``limits.max_relative_dynamics_factor``.
            SafetyBypassError: the arm already has a safety layer.
        """
        if arm.relative_dynamics_factor > limits.max_relative_dynamics_factor:
            raise ValueError(f"{arm} moves with relative_dynamics_factor={arm.relative_dynamics_factor}, above "
                             f"max_relative_dynamics_factor={limits.max_relative_dynamics_factor} of the safety "
                             f"limits: lower the arm's factor or raise the limit")
        self.arm = arm
        self.limits = limits
        self._permit = object()
        arm._attach_safety(self._permit, dry_run=limits.dry_run)
        self._command_lock = threading.Lock()
        self._counts_lock = threading.Lock()
        self.clamp_counts: dict[str, int] = {kind: 0 for kind in CLAMP_KINDS}
        self._warned: set[str] = set()
        self._stops = 0
        """Stops asked for (``stop()``, a refused action); an action sees whether one came while it was sent."""
        self._gripper_closed: bool | None = None
        self._gripper_changed_s = -math.inf
        self._stepped_s = -math.inf
        self.last_watchdog_trip_s: float | None = None
        self._watchdog = Watchdog(limits.watchdog_timeout_s, self._on_watchdog)
        self._closed = False

    def __repr__(self) -> str:
        return f"SafetyLayer({self.arm}{', dry run' if self.limits.dry_run else ''})"

    def __enter__(self) -> "SafetyLayer":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop the arm, end the watchdog and release the arm (it then refuses motion commands). A Ctrl-C
        or SIGTERM meanwhile is delivered once this is done."""
        if self._closed:
            return
        with deferred_interrupts():  # a Ctrl-C now would cut the stop short, or leave the arm attached
            self._closed = True
            self._watchdog.close()
            if self.arm.is_connected:
                self._stop_arm()
            self.arm._detach_safety(self._permit)

    # ----- reading and stopping pass straight through ------------------------------------------
    def observation(self) -> "ArmObservation":
        """The arm's current state (``Arm.observation``)."""
        return self.arm.observation()

    @property
    def stop_count(self) -> int:
        """Stops asked for so far: a caller that takes an action from a queue reads it with the action
        and passes it as ``send_action(..., stops_since=)``, so a stop after the take wins."""
        return self._stops

    def stop(self) -> None:
        """Stop the arm now. An action being sent from another thread sends nothing more
        (``SentCommand.preempted``); the next action moves again. Dry run: only logs."""
        self._stops += 1  # before the arm's stop: an action that reads it after sends nothing
        self._stop_arm()

    def _stop_arm(self) -> None:
        if self.limits.dry_run:  # nothing of ours moves it; a ROS arm's stop would publish a target
            logger.info("dry run: would stop the arm")
            return
        self.arm.stop()

    def recover(self) -> bool:
        """``Arm.recover``: clear an error state."""
        return self.arm.recover()

    def pop_clamp_counts(self) -> dict[str, int]:
        """The clamp counts since the last call (for an episode's info), then zero them."""
        with self._counts_lock:
            counts = dict(self.clamp_counts)
            self.clamp_counts = {kind: 0 for kind in CLAMP_KINDS}
            self._warned.clear()
        return counts

    def _count(self, kinds: list[str] | tuple[str, ...]) -> None:
        with self._counts_lock:
            for kind in kinds:
                self.clamp_counts[kind] += 1
                if kind not in self._warned:  # one warning per kind until the counts are popped
                    self._warned.add(kind)
                    logger.warning("safety: %s limited a command (counted in clamp_counts)", kind)

    # ----- commands --------------------------------------------------------------------------------
    def send_action(self, action: Any, stops_since: int | None = None) -> SentCommand:
        """Limit one normalised twin action and send it.

        Args:
            action: ``[7]`` floats: translation (3), rotation (3), gripper (-1 open, +1 close); see
                ``real_robot.twin_action`` for the scale and frames.
            stops_since: ``stop_count`` when the caller took the action (from a queue another thread
                stops); a stop since then preempts it. None: from this call on.

        Returns:
            What was sent (in dry-run mode: what would have been).

        Raises:
            UnsafeActionError: not 7 finite real numbers; the arm was stopped and nothing was sent.
            InvalidStateError: the arm reports a TCP pose that is no rigid transform; the arm was
                stopped and nothing was sent.
            DeviceNotConnectedError: the arm is not connected.
            MotionError: the arm aborted the motion.
        """
        import numpy as np

        from real_robot.errors import InvalidStateError
        from real_robot.transforms import is_rigid_transform, matrix_to_rotvec, pose_matrix
        from real_robot.twin_action import action_to_step, step_to_action

        self._check_open()
        stops = self._stops if stops_since is None else stops_since  # a stop from then on wins over this action
        try:  # real numbers only: a complex part, a string or an object would be dropped or parsed
            if np.asarray(action).dtype.kind not in "biuf":
                raise TypeError
            values = np.asarray(action, dtype=np.float64)
        except Exception:  # noqa: BLE001 - whatever the input, the answer is a refusal, not a traceback
            values = None
        if values is None or values.shape != (7,):
            self.stop()
            raise UnsafeActionError(f"an action is 7 numbers (translation 3, rotation 3, gripper 1), got "
                                    f"{action!r}; nothing was sent and the arm was stopped")
        bad = np.flatnonzero(~np.isfinite(values))
        if bad.size:
            self.stop()
            self._count(["non_finite"])
            raise UnsafeActionError(f"action {values.tolist()} has non-finite values at indices {bad.tolist()}; "
                                    f"nothing was sent and the arm was stopped")

        with self._command_lock:
            self._watchdog.disarm()  # the deadline counts from the end of this command
            try:
                wait_s = self._stepped_s + self.limits.min_step_interval_s - time.monotonic()
                if wait_s > 0 and not self.limits.dry_run:
                    self._count(["step_rate"])
                    time.sleep(wait_s)
                try:  # read after the wait: the step starts from where the arm is
                    obs = self.arm.observation()
                    if not is_rigid_transform(obs.T_base_from_tcp):  # a target built on it would be no pose
                        raise InvalidStateError(f"{self.arm} reports a TCP pose that is no rigid transform "
                                                f"({obs.T_base_from_tcp.tolist()})")
                except InvalidStateError as e:
                    self._count(["non_finite"])
                    self.stop()
                    raise InvalidStateError(f"{e}; nothing was sent and the arm was stopped") from None
                translation, R_delta, close, out_of_range = action_to_step(values)
                clamps = ["action_range"] if out_of_range else []
                translation, R_delta, step_clamps = limit_step(translation, R_delta, obs.T_base_from_tcp, self.limits)
                clamps += step_clamps
                gripper_changed = close != self._gripper_closed
                if gripper_changed and self._gripper_closed is not None and (
                        time.monotonic() - self._gripper_changed_s < self.limits.gripper_min_interval_s):
                    close, gripper_changed = self._gripper_closed, False
                    clamps.append("gripper_rate")
                preempted = self._stops != stops
                if preempted:  # stopped while waiting or reading: send nothing, limit nothing
                    translation, R_delta, close, gripper_changed = np.zeros(3), np.eye(3), self._gripper_closed, False
                    clamps = []
                rotvec = matrix_to_rotvec(R_delta)
                T_target = pose_matrix(obs.T_base_from_tcp[:3, 3] + translation, R_delta @ obs.T_base_from_tcp[:3, :3])
                sent = SentCommand(action=step_to_action(translation, R_delta, bool(close)), translation_m=translation,
                                   rotation_rotvec_rad=rotvec, gripper_close=bool(close),
                                   gripper_changed=gripper_changed, T_base_from_tcp_target=T_target,
                                   clamps=tuple(clamps), dry_run=self.limits.dry_run, preempted=preempted)
                self._count(clamps)
                if sent.preempted:
                    return sent
                if self.limits.dry_run:
                    logger.info("dry run: would move the TCP by %s m, rotate by %s rad%s", np.round(translation, 4),
                                np.round(rotvec, 4), f", {'close' if close else 'open'} the gripper" if gripper_changed
                                else "")
                else:
                    # a zero step holds the arm where it is going: the measured pose trails franky's desired one,
                    # and sending it as a target would creep (franky-sim: 0.02 deg per hold)
                    if np.linalg.norm(translation) >= ZERO_STEP_M or np.linalg.norm(rotvec) >= ZERO_STEP_RAD:
                        try:  # a stop from here on either keeps the motion from starting or ends it
                            started = self.arm.move_to_pose(T_target, permit=self._permit,
                                                            preempted=lambda: self._stops != stops)
                        except MotionError:
                            if self._stops == stops:
                                raise  # franky reports a stop's cut as "Move command preempted"; that is ours
                            started = True
                        if started:
                            self._stepped_s = time.monotonic()
                        if self._stops != stops:  # a stop cut the move, or came before it began
                            kept = bool(self._gripper_closed)  # the gripper command was not sent
                            if not started:
                                translation, R_delta, rotvec = np.zeros(3), np.eye(3), np.zeros(3)
                            return replace(sent, action=step_to_action(translation, R_delta, kept),
                                           translation_m=translation, rotation_rotvec_rad=rotvec,
                                           T_base_from_tcp_target=T_target if started else obs.T_base_from_tcp,
                                           gripper_close=kept, gripper_changed=False, preempted=True)
                    if gripper_changed:  # kept by the arm while its gripper ends the previous command
                        self.arm.set_gripper(close, permit=self._permit)
                    else:
                        self.arm.update_gripper(permit=self._permit)
                if gripper_changed:
                    self._gripper_closed = close
                    self._gripper_changed_s = time.monotonic()
                return sent
            finally:
                self._watchdog.kick()

    def home(self) -> None:
        """Move to ``limits.home_joint_positions_rad`` (joint space, the arm's dynamics factor). The
        watchdog is paused until the next action. In dry-run mode only logs.

        Raises:
            MotionError: the arm aborted the move, or a ``stop()`` (another thread's) cut it short of home.
        """
        self._check_open()
        with self._command_lock:
            self._watchdog.disarm()
            if self.limits.dry_run:
                logger.info("dry run: would move home to %s", self.limits.home_joint_positions_rad)
                return
            stops = self._stops
            self.arm.move_to_joint_positions(self.limits.home_joint_positions_rad, permit=self._permit,
                                             preempted=lambda: self._stops != stops)
            if self._stops != stops:  # franky ends a stopped move without an error; or it never began
                raise MotionError(f"{self.arm}: a stop cut the move home short; the arm holds where it stopped")

    def open_gripper(self) -> None:
        """Open the gripper (an episode's start), waiting out ``gripper_min_interval_s`` when it
        changed less long ago rather than holding the command as an action's change would be. The
        watchdog is paused until the next action. In dry-run mode only logs."""
        self._check_open()
        with self._command_lock:
            self._watchdog.disarm()
            if self._gripper_closed is False and not self.arm.gripper_command_kept:
                return  # open, or opening (a kept open is the command to send now)
            wait_s = self._gripper_changed_s + self.limits.gripper_min_interval_s - time.monotonic()
            if self.limits.dry_run:
                logger.info("dry run: would open the gripper")
            else:
                if wait_s > 0:
                    time.sleep(wait_s)
                self.arm.set_gripper(False, permit=self._permit, wait_for_running=True)
            self._gripper_closed, self._gripper_changed_s = False, time.monotonic()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{self} is closed; make a new SafetyLayer")

    def _on_watchdog(self) -> None:
        # An action arriving right now holds the lock: it is not silence, let it through.
        if not self._command_lock.acquire(blocking=False):
            return
        try:
            if self._watchdog.armed:  # an action was sent between the firing and the lock: not silence
                return
            self.last_watchdog_trip_s = time.monotonic()
            logger.warning("safety watchdog: no action within %.3f s, stopping the arm", self.limits.watchdog_timeout_s)
            self._stop_arm()
            self._count(["watchdog"])
        finally:
            self._command_lock.release()
