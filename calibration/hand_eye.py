"""Hand-eye calibration: where the camera is relative to the robot, from robot and board poses.

Two setups, one equation per sample ``i``, both unknowns constant:

* eye-to-hand (ours: the camera is fixed, the board rides on the flange)::

      T_base_from_ee[i] @ T_ee_from_board  ==  T_base_from_cam @ T_cam_from_board[i]

  solved for ``T_base_from_cam`` (the camera file's pose) and ``T_ee_from_board``.
* eye-in-hand (the camera rides on the flange, the board is fixed)::

      T_base_from_board  ==  T_base_from_ee[i] @ T_ee_from_cam @ T_cam_from_board[i]

  solved for ``T_ee_from_cam`` and ``T_base_from_board``.

``T_base_from_ee`` comes from the robot, ``T_cam_from_board`` from PnP on the board's corners.
Five OpenCV solvers run on the same data: ``cv2.calibrateHandEye`` with PARK, HORAUD, ANDREFF
and DANIILIDIS, and ``cv2.calibrateRobotWorldHandEye`` (SHAH), which estimates both unknowns at
once. Their answers are cross-checked. TSAI, OpenCV's default, is not used: it fails when the
camera-to-base rotation is near 180 degrees, a common mounting (a camera facing the robot).

Each solution is scored by its residuals: with the solved camera transform and the fitted
board transform, the board seen through the robot chain and through the camera chain should
coincide in every sample. The residual is how far the board's centre (mm) and orientation
(deg) differ between the two chains. Noise-free data gives zero; a few tenths of a millimetre
is typical; millimetres mean bad robot poses, a wrong board spec or intrinsics, or a board
that moved on the flange.

One error the residuals barely show: a board printed at another scale than its spec says.
PnP then scales every board distance, and the solution absorbs most of it by moving the camera
along its optical axis (a 2 % scale: about 15 mm off, with a residual of 3 mm, under the limit).
The robot's motion fixes the metric scale, so the scale is fitted (the one factor on the board's
translations that minimises the residuals) and a calibration whose board is off by more than
``DEFAULT_MAX_SCALE_ERROR`` fails, naming how many percent off the board is.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import numpy as np

from calibration.errors import CalibrationError, InsufficientRotationError, TooFewSamplesError
from calibration.transforms import invert, make_transform, mean_transform, matrix_to_rotvec, transform_difference

METHODS = ("park", "horaud", "andreff", "daniilidis", "robot_world")
MIN_SAMPLES = 5
MIN_ROTATION_DEG = 15.0
MIN_AXIS_SPREAD_DEG = 10.0
DEFAULT_MAX_TRANS_MM = 5.0
DEFAULT_MAX_ROT_DEG = 0.5
DEFAULT_MAX_SCALE_ERROR = 0.005
"""Largest accepted relative error of the board's printed size (0.5 %: 0.18 mm on a 35 mm square, and
about 4 mm along the optical axis of a camera 0.8 m away)."""
SCALE_SEARCH = (0.8, 1.25)


class Mode(str, Enum):
    """Where the camera is."""

    EYE_TO_HAND = "eye_to_hand"
    """Camera fixed in the base frame, board on the flange (the twin's third-person camera)."""
    EYE_IN_HAND = "eye_in_hand"
    """Camera on the flange, board fixed in the base frame."""

    @classmethod
    def parse(cls, value) -> Mode:
        """A Mode from its value, or a ValueError listing the allowed ones."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"mode {value!r} is not allowed; allowed: {', '.join(m.value for m in cls)}") from None


@dataclass(frozen=True)
class Residuals:
    """Per-sample disagreement between the robot chain and the camera chain."""

    trans_mm: np.ndarray
    """``[N]`` distance between the board centre's two positions, mm."""
    rot_deg: np.ndarray
    """``[N]`` angle between the board's two orientations, degrees."""

    @property
    def trans_rms_mm(self) -> float:
        return float(np.sqrt(np.mean(self.trans_mm ** 2)))

    @property
    def rot_rms_deg(self) -> float:
        return float(np.sqrt(np.mean(self.rot_deg ** 2)))

    @property
    def trans_max_mm(self) -> float:
        return float(self.trans_mm.max())

    @property
    def rot_max_deg(self) -> float:
        return float(self.rot_deg.max())

    def to_dict(self) -> dict:
        return {"trans_rms_mm": round(self.trans_rms_mm, 4), "trans_max_mm": round(self.trans_max_mm, 4),
                "rot_rms_deg": round(self.rot_rms_deg, 5), "rot_max_deg": round(self.rot_max_deg, 5)}


@dataclass(frozen=True)
class MethodResult:
    """One solver's answer, or why it has none."""

    method: str
    T_cam: np.ndarray | None
    """The camera transform: ``T_base_from_cam`` (eye-to-hand) or ``T_ee_from_cam`` (eye-in-hand)."""
    T_board: np.ndarray | None
    """The board transform fitted to it: ``T_ee_from_board`` or ``T_base_from_board``."""
    residuals: Residuals | None
    failure: str | None = None

    @property
    def ok(self) -> bool:
        return self.failure is None


@dataclass(frozen=True)
class HandEyeResult:
    """Every solver's answer, the one chosen, and whether its residuals pass."""

    mode: Mode
    methods: dict[str, MethodResult]
    chosen: str
    max_trans_mm: float
    max_rot_deg: float
    sample_names: tuple[str, ...]
    max_rotation_deg: float
    """Largest relative rotation between two robot poses (diversity check)."""
    axis_spread_deg: float
    """How far the relative-rotation axes spread, as the angle between two equally weighted axes
    (diversity check; ``check_rotation_diversity``)."""
    board_scale: float = 1.0
    """The printed board's size over its spec's, fitted from the data (1.0: as specified)."""
    max_scale_error: float = DEFAULT_MAX_SCALE_ERROR

    @property
    def scale_passed(self) -> bool:
        return abs(self.board_scale - 1.0) <= self.max_scale_error

    @property
    def solution(self) -> MethodResult:
        return self.methods[self.chosen]

    @property
    def passed(self) -> bool:
        """The chosen solution's RMS residuals are within both thresholds, and the board's fitted
        scale within ``max_scale_error`` of its spec."""
        r = self.solution.residuals
        return r.trans_rms_mm <= self.max_trans_mm and r.rot_rms_deg <= self.max_rot_deg and self.scale_passed

    @property
    def T_base_from_cam(self) -> np.ndarray:
        """The fixed camera's pose in the base frame (eye-to-hand only)."""
        if self.mode is not Mode.EYE_TO_HAND:
            raise AttributeError("T_base_from_cam exists for eye_to_hand; an eye_in_hand result has T_ee_from_cam")
        return self.solution.T_cam

    @property
    def T_ee_from_cam(self) -> np.ndarray:
        """The flange camera's pose in the ee frame (eye-in-hand only)."""
        if self.mode is not Mode.EYE_IN_HAND:
            raise AttributeError("T_ee_from_cam exists for eye_in_hand; an eye_to_hand result has T_base_from_cam")
        return self.solution.T_cam

    def agreement(self) -> dict[str, tuple[float, float]]:
        """Each working method's camera transform against the chosen one: (mm, deg) between the
        two camera positions and orientations."""
        ref = self.solution.T_cam
        return {m: transform_difference(ref, r.T_cam) for m, r in self.methods.items() if r.ok}

    def report(self) -> dict:
        """JSON-ready: thresholds, pass/fail, per-method residuals and agreement."""
        agreement = self.agreement()
        methods = {}
        for m, r in self.methods.items():
            if r.ok:
                methods[m] = {**r.residuals.to_dict(), "vs_chosen_mm": round(agreement[m][0], 4),
                              "vs_chosen_deg": round(agreement[m][1], 5)}
            else:
                methods[m] = {"failure": r.failure}
        return {"mode": self.mode.value, "method": self.chosen, "passed": self.passed,
                "thresholds": {"max_trans_mm": self.max_trans_mm, "max_rot_deg": self.max_rot_deg},
                "num_samples": len(self.sample_names),
                "pose_diversity": {"max_rotation_deg": round(self.max_rotation_deg, 2),
                                   "axis_spread_deg": round(self.axis_spread_deg, 2)},
                "board_scale": {"fitted": round(self.board_scale, 5), "max_error": self.max_scale_error,
                                "passed": self.scale_passed},
                "residuals": methods}

    def summary(self) -> str:
        """The residual table printed by the CLI."""
        agreement = self.agreement()
        lines = [f"{len(self.sample_names)} samples; robot poses rotate up to {self.max_rotation_deg:.1f} deg, "
                 f"rotation axes spread {self.axis_spread_deg:.1f} deg",
                 f"{'method':<12} {'trans rms':>9} {'max':>7} (mm)  {'rot rms':>8} {'max':>7} (deg)  "
                 f"{'vs chosen':>9} (mm, deg)"]
        for m, r in self.methods.items():
            if not r.ok:
                lines.append(f"{m:<12} failed: {r.failure}")
                continue
            s = r.residuals
            mark = "  <- chosen" if m == self.chosen else ""
            lines.append(f"{m:<12} {s.trans_rms_mm:9.3f} {s.trans_max_mm:7.3f}       {s.rot_rms_deg:8.4f} "
                         f"{s.rot_max_deg:7.4f}        {agreement[m][0]:9.3f} {agreement[m][1]:7.4f}{mark}")
        lines.append(f"board scale fitted from the robot's motion: {self.board_scale:.4f} of its spec "
                     f"(limit {1 - self.max_scale_error:g}..{1 + self.max_scale_error:g})")
        s = self.solution.residuals
        r_ok = s.trans_rms_mm <= self.max_trans_mm and s.rot_rms_deg <= self.max_rot_deg  # else the scale means little
        worst = self.sample_names[int(np.argmax(s.trans_mm))]
        verdict = "PASS" if self.passed else "FAIL"
        lines.append(f"{verdict}: {self.chosen} residuals {s.trans_rms_mm:.3f} mm / {s.rot_rms_deg:.4f} deg RMS "
                     f"(limits {self.max_trans_mm:g} mm / {self.max_rot_deg:g} deg); worst sample {worst} "
                     f"({s.trans_max_mm:.3f} mm)")
        if not self.scale_passed and r_ok:
            lines.append(f"FAIL: the board seen through the camera is {100 * (self.board_scale - 1):+.2f} % the size "
                         "its spec says (a printer's scaling, or a wrong square_length_m / marker_length_m): measure "
                         "a printed square with calipers and fix the spec; the camera would sit "
                         "centimetres off along its optical axis")
        return "\n".join(lines)


def check_rotation_diversity(T_base_from_ee: Sequence[np.ndarray], min_rotation_deg: float = MIN_ROTATION_DEG,
                             min_axis_spread_deg: float = MIN_AXIS_SPREAD_DEG) -> tuple[float, float]:
    """Check the robot poses rotate enough, about more than one axis, for hand-eye to be solvable.

    The camera transform's rotation is observed only through rotations of the robot, and its
    translation along an axis only when the robot rotates about a different one: pure
    translations, or rotations about one axis, leave it unobservable.

    The spread is measured over all the relative rotations, weighted by their angle: with
    ``λ1 >= λ2`` the two largest eigenvalues of ``Σ θ² a aᵀ`` (axis ``a``, angle ``θ``), it is
    ``2 atan(sqrt(λ2 / λ1))``, the angle between two axes carrying equal weight. One pose off an
    otherwise single axis barely moves it (the largest angle between two axes would read 90 deg
    there, and the translation along that axis is still poorly determined).

    Returns:
        ``(max_rotation_deg, axis_spread_deg)``: the largest relative rotation between two
        poses, and the spread of the relative rotations' axes.

    Raises:
        InsufficientRotationError: saying which condition failed and what to do.
    """
    R = np.asarray(T_base_from_ee, dtype=float)[:, :3, :3]
    i, j = np.triu_indices(len(R), k=1)
    rel = np.einsum("nji,njk->nik", R[i], R[j])  # R_i^T R_j: motion between poses, in the ee frame
    rotvecs = np.array([matrix_to_rotvec(r) for r in rel])
    angles_deg = np.degrees(np.linalg.norm(rotvecs, axis=1))
    max_rotation_deg = float(angles_deg.max())
    if max_rotation_deg < min_rotation_deg:
        raise InsufficientRotationError(
            f"the robot poses barely rotate: the largest rotation between two poses is {max_rotation_deg:.1f} deg, "
            f"need >= {min_rotation_deg:g} deg. Pure translations cannot calibrate hand-eye: tilt the flange "
            "by 20-40 deg about different axes between poses")
    # Σ θ² a aᵀ = Σ r rᵀ over the rotation vectors r = θ a: an axis and its opposite count as one line
    eigenvalues = np.linalg.eigvalsh(rotvecs.T @ rotvecs)  # ascending
    axis_spread_deg = float(np.degrees(2.0 * np.arctan(np.sqrt(max(eigenvalues[1], 0.0) / eigenvalues[2]))))
    if axis_spread_deg < min_axis_spread_deg:
        raise InsufficientRotationError(
            f"the robot poses rotate about nearly one axis only (rotation axes nearly parallel: they spread "
            f"{axis_spread_deg:.1f} deg, need >= {min_axis_spread_deg:g} deg); the translation along that axis is "
            "unobservable. Rotate the flange about at least two different axes (e.g. tilt and roll)")
    return max_rotation_deg, axis_spread_deg


def _split(Ts: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    return [T[:3, :3] for T in Ts], [T[:3, 3].reshape(3, 1) for T in Ts]


def _solve(method: str, mode: Mode, T_base_from_ee: list[np.ndarray], T_cam_from_board: list[np.ndarray]
           ) -> np.ndarray:
    """One OpenCV solver's camera transform (T_base_from_cam or T_ee_from_cam)."""
    import cv2

    R_board, t_board = _split(T_cam_from_board)
    if method == "robot_world":
        # solves A X = Z B with A = T_cam_from_world, B = T_gripper_from_base (OpenCV's names).
        # Eye-to-hand: "world" is the board and "gripper" the base, so B = T_base_from_ee and
        # Z = T_cam_from_base. Eye-in-hand: B = T_ee_from_base and Z = T_cam_from_ee.
        robot = T_base_from_ee if mode is Mode.EYE_TO_HAND else [invert(T) for T in T_base_from_ee]
        R_robot, t_robot = _split(robot)
        _, _, R_z, t_z = cv2.calibrateRobotWorldHandEye(R_board, t_board, R_robot, t_robot,
                                                        method=cv2.CALIB_ROBOT_WORLD_HAND_EYE_SHAH)
        return invert(make_transform(R_z, t_z))
    # calibrateHandEye solves the eye-in-hand equation for T_gripper_from_cam given
    # T_base_from_gripper. For eye-to-hand OpenCV's documentation passes the inverted robot
    # poses (T_ee_from_base): the roles of base and ee swap and it returns T_base_from_cam.
    robot = [invert(T) for T in T_base_from_ee] if mode is Mode.EYE_TO_HAND else T_base_from_ee
    R_robot, t_robot = _split(robot)
    flag = {"park": cv2.CALIB_HAND_EYE_PARK, "horaud": cv2.CALIB_HAND_EYE_HORAUD,
            "andreff": cv2.CALIB_HAND_EYE_ANDREFF, "daniilidis": cv2.CALIB_HAND_EYE_DANIILIDIS}[method]
    R_x, t_x = cv2.calibrateHandEye(R_robot, t_robot, R_board, t_board, method=flag)
    return make_transform(R_x, t_x)


def fit_board_and_residuals(mode: Mode, T_cam: np.ndarray, T_base_from_ee: Sequence[np.ndarray],
                            T_cam_from_board: Sequence[np.ndarray], point: np.ndarray | None = None
                            ) -> tuple[np.ndarray, Residuals]:
    """Given a camera transform, fit the board transform (mean over samples) and the residuals.

    Every method is scored with the board transform that fits its own camera transform best,
    so the residuals compare the camera transforms alone.

    Args:
        mode: the setup.
        T_cam: ``T_base_from_cam`` (eye-to-hand) or ``T_ee_from_cam`` (eye-in-hand).
        T_base_from_ee, T_cam_from_board: the samples.
        point: where on the board translations are compared (board frame; default its origin).

    Returns:
        ``(T_board, residuals)``: ``T_ee_from_board`` or ``T_base_from_board``, and per-sample
        residuals.
    """
    if mode is Mode.EYE_TO_HAND:
        per_sample = [invert(Tbe) @ T_cam @ Tcb for Tbe, Tcb in zip(T_base_from_ee, T_cam_from_board)]
        T_board = mean_transform(per_sample)
        pairs = [(Tbe @ T_board, T_cam @ Tcb) for Tbe, Tcb in zip(T_base_from_ee, T_cam_from_board)]
    else:
        per_sample = [Tbe @ T_cam @ Tcb for Tbe, Tcb in zip(T_base_from_ee, T_cam_from_board)]
        T_board = mean_transform(per_sample)
        pairs = [(T_board, T) for T in per_sample]
    diffs = np.array([transform_difference(a, b, point) for a, b in pairs])
    return T_board, Residuals(diffs[:, 0], diffs[:, 1])


def solve_hand_eye(T_base_from_ee: Sequence[np.ndarray], T_cam_from_board: Sequence[np.ndarray], *,
                   mode: Mode | str = Mode.EYE_TO_HAND, method: str = "auto",
                   max_trans_mm: float = DEFAULT_MAX_TRANS_MM, max_rot_deg: float = DEFAULT_MAX_ROT_DEG,
                   names: Sequence[str] | None = None, board_point: np.ndarray | None = None,
                   min_samples: int = MIN_SAMPLES, min_rotation_deg: float = MIN_ROTATION_DEG,
                   min_axis_spread_deg: float = MIN_AXIS_SPREAD_DEG,
                   max_scale_error: float = DEFAULT_MAX_SCALE_ERROR) -> HandEyeResult:
    """Solve hand-eye with every method, score them, and pick one.

    Args:
        T_base_from_ee: robot poses, one 4x4 per sample (metres).
        T_cam_from_board: board poses in the camera, same order.
        mode: ``eye_to_hand`` or ``eye_in_hand``.
        method: ``auto`` (the method with the smallest residuals, each measured against the
            thresholds) or one of ``METHODS``.
        max_trans_mm, max_rot_deg: pass/fail limits on the chosen method's RMS residuals.
        names: sample names for reports (default ``"0"``, ``"1"``, ...).
        board_point: where on the board translation residuals are measured, board frame
            (default its origin; sessions use the board's centre).
        min_samples: fewest samples accepted.
        min_rotation_deg, min_axis_spread_deg: rotation diversity limits
            (``check_rotation_diversity``).
        max_scale_error: largest accepted ``|board_scale - 1|``, the board's fitted scale
            (``fit_board_scale``) against its spec.

    Returns:
        Every method's result, the chosen one and whether it passes.

    Raises:
        TooFewSamplesError: fewer than ``min_samples`` samples.
        InsufficientRotationError: the poses do not rotate enough or about one axis only.
        CalibrationError: every method failed, or the requested one did.
        ValueError: on mismatched inputs or an unknown method or mode.
    """
    mode = Mode.parse(mode)
    if method != "auto" and method not in METHODS:
        raise ValueError(f"method {method!r} is not allowed; allowed: auto, {', '.join(METHODS)} "
                         "(TSAI is left out on purpose: it fails near a 180-degree camera rotation)")
    if not (max_trans_mm > 0 and max_rot_deg > 0 and max_scale_error > 0):
        raise ValueError(f"max_trans_mm, max_rot_deg and max_scale_error must be > 0, got {max_trans_mm}, "
                         f"{max_rot_deg}, {max_scale_error}")
    robot = [np.asarray(T, dtype=float) for T in T_base_from_ee]
    board = [np.asarray(T, dtype=float) for T in T_cam_from_board]
    if len(robot) != len(board):
        raise ValueError(f"{len(robot)} robot poses but {len(board)} board poses: one of each per sample")
    if any(T.shape != (4, 4) for T in robot + board):
        raise ValueError("every pose must be a 4x4 transform")
    names = tuple(str(n) for n in (names if names is not None else range(len(robot))))
    if len(names) != len(robot):
        raise ValueError(f"{len(names)} names for {len(robot)} samples")
    if len(robot) < min_samples:
        raise TooFewSamplesError(f"{len(robot)} poses given; hand-eye needs >= {min_samples} (15-25 recommended, "
                                 "with the flange tilted 20-40 deg about different axes)")
    max_rotation_deg, axis_spread_deg = check_rotation_diversity(robot, min_rotation_deg, min_axis_spread_deg)

    import cv2

    results: dict[str, MethodResult] = {}
    for m in METHODS:
        try:
            T_cam = _solve(m, mode, robot, board)
            if not np.isfinite(T_cam).all() or abs(np.linalg.det(T_cam[:3, :3]) - 1.0) > 1e-3:
                raise CalibrationError("the solver returned a matrix that is not a rigid transform")
        except (cv2.error, CalibrationError, np.linalg.LinAlgError) as e:
            results[m] = MethodResult(m, None, None, None, failure=str(e).strip().splitlines()[-1][:200])
            continue
        T_board, residuals = fit_board_and_residuals(mode, T_cam, robot, board, board_point)
        results[m] = MethodResult(m, T_cam, T_board, residuals)

    working = {m: r for m, r in results.items() if r.ok}
    if not working:
        failures = "; ".join(f"{m}: {r.failure}" for m, r in results.items())
        raise CalibrationError(f"every hand-eye method failed: {failures}")
    if method == "auto":
        def score(r: MethodResult) -> float:
            return r.residuals.trans_rms_mm / max_trans_mm + r.residuals.rot_rms_deg / max_rot_deg
        chosen = min(working, key=lambda m: score(working[m]))
    elif method in working:
        chosen = method
    else:
        raise CalibrationError(f"method {method} failed ({results[method].failure}); try --method auto")
    board_scale = fit_board_scale(chosen, mode, robot, board, board_point)
    return HandEyeResult(mode, results, chosen, float(max_trans_mm), float(max_rot_deg), names,
                         max_rotation_deg, axis_spread_deg, board_scale, float(max_scale_error))


def fit_board_scale(method: str, mode: Mode, T_base_from_ee: Sequence[np.ndarray],
                    T_cam_from_board: Sequence[np.ndarray], point: np.ndarray | None = None) -> float:
    """The factor on the board's size (printed over specified) that makes ``method``'s solution fit best.

    PnP with the spec's size places a board printed ``s`` times that size at ``1 / s`` of its
    true distance: every board translation is the truth's divided by ``s``. The robot's
    translations are metric, so only the true scale lets both chains agree: this searches the
    factor on the board translations that minimises the RMS translation residual, which is ``s``.
    """
    from scipy.optimize import minimize_scalar

    point = np.zeros(3) if point is None else np.asarray(point, dtype=float)

    def rms_mm(k: float) -> float:
        scaled = [make_transform(T[:3, :3], T[:3, 3] * k) for T in T_cam_from_board]
        try:
            T_cam = _solve(method, mode, list(T_base_from_ee), scaled)
        except Exception:  # noqa: BLE001 - a factor where the solver fails is simply not the answer
            return float("inf")
        if not np.isfinite(T_cam).all():
            return float("inf")
        return fit_board_and_residuals(mode, T_cam, T_base_from_ee, scaled, point * k)[1].trans_rms_mm

    best = minimize_scalar(rms_mm, bounds=SCALE_SEARCH, method="bounded", options={"xatol": 1e-5})
    return float(best.x)

