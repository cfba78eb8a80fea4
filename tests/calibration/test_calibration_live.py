"""Live hand-eye collection (``calibration.collect``, ``vla-calibrate handeye --robot-ip``) on franky-sim.

The arm is real franky over libfranka's protocol against franky-sim (the ``franky_sim`` fixture),
behind a ``SafetyLayer`` with a box around its home. Only the physical camera is replaced: a
``Camera`` subclass renders the board (``calibration.synthetic``) where the flange carries it, at
the TCP pose franky-sim reports, through a camera at a known ``T_base_from_cam``. The session it
records is solved with the real OpenCV and written as the camera file the twin loads.
"""

from __future__ import annotations

import importlib.util
import json
import math
import time
from pathlib import Path

import numpy as np
import pytest

from calibration.board import BoardSpec
from calibration.cli import main
from calibration.collect import (PoseNotReachedError, calibration_poses, collect_session, load_poses, move_to_pose,
                                 pose_limit_problems, save_poses)
from calibration.errors import TooFewSamplesError
from calibration.hand_eye import Mode, check_rotation_diversity
from calibration.session import SessionSpec, load_session
from calibration.synthetic import BoardRenderer, default_intrinsics, look_at
from calibration.transforms import invert, make_transform, matrix_to_rotvec, rotvec_to_matrix
from franky_sim_server import HOME_TCP_POSITION_M, connected_layer, free_loopback_address
from real_robot.camera import Camera, CameraFrame
from real_robot.safety import SafetyLimits, orientation_excess_rad

needs_franky = pytest.mark.skipif(importlib.util.find_spec("franky") is None,
                                  reason="the arm is driven through franky (the [robot] extra)")
needs_realsense = pytest.mark.skipif(importlib.util.find_spec("pyrealsense2") is None,
                                     reason="the camera is pyrealsense2 (the [robot] extra)")

HOME = np.array(HOME_TCP_POSITION_M)
R_HOME = np.diag([1.0, -1.0, -1.0])  # the TCP pointing down, x along the base's x (the limits' reference)
BOX_HALF_M = 0.08
CAMERA_POSITION_M = HOME + np.array([0.45, -0.40, 0.10])  # beside and above the workspace, ~0.6 m away
SPEC = BoardSpec()
INTRINSICS = default_intrinsics()


def box_limits() -> dict:
    return dict(workspace_min_m=tuple(HOME - BOX_HALF_M), workspace_max_m=tuple(HOME + BOX_HALF_M))


def true_setup() -> tuple[np.ndarray, np.ndarray]:
    """(T_base_from_cam, T_tcp_from_board): the camera looks at the home TCP; the board is on a bracket
    6 cm from the TCP, facing the camera at home, turned 8 deg off square (as mounted by hand)."""
    T_base_from_cam = look_at(CAMERA_POSITION_M, HOME)
    R_board = rotvec_to_matrix(np.radians([5.0, -6.0, 3.0])) @ T_base_from_cam[:3, :3]  # z into the board
    centre = HOME + 0.06 * (CAMERA_POSITION_M - HOME) / np.linalg.norm(CAMERA_POSITION_M - HOME)
    T_base_from_board = make_transform(R_board, centre - R_board @ SPEC.center_m)
    return T_base_from_cam, invert(make_transform(R_HOME, HOME)) @ T_base_from_board


class FlangeBoardCamera(Camera):
    """Stands in for the physical camera: each frame shows the board where the flange carries it, at
    the TCP pose the arm reports when the frame is taken (``T_cam_from_board = inv(T_base_from_cam)
    @ T_base_from_tcp @ T_tcp_from_board``), with pixel noise. While the TCP moves between two
    frames the frame is a blank gray (a motion-blurred view; rendering it would only cost time), so
    a frame taken before the arm settled cannot pass as a sample."""

    def __init__(self, arms: list, T_base_from_cam, T_tcp_from_board, seed: int = 0, fps: float = 10.0,
                 board_visible: bool = True):
        """``arms``: the arm whose flange carries the board is the last one in the list (once connected)."""
        super().__init__()
        self._arms, self._T_cam_from_base, self._T_tcp_from_board = arms, invert(T_base_from_cam), T_tcp_from_board
        self._rng, self._period_s, self._board_visible = np.random.default_rng(seed), 1.0 / fps, board_visible
        self._renderer = BoardRenderer(SPEC)
        self._blank = np.full((INTRINSICS.height, INTRINSICS.width), 105, np.uint8)
        self._n, self._last_T, self._cached = 0, None, None

    @property
    def image_hw(self) -> tuple[int, int]:
        return INTRINSICS.height, INTRINSICS.width

    def _open(self) -> None:
        self._n, self._last_T, self._cached = 0, None, None

    def _flange_pose(self):
        try:
            return self._arms[-1].observation().T_base_from_tcp
        except (IndexError, ConnectionError):  # no arm yet, or it was disconnected first
            return None

    def _grab(self, timeout_ms: int) -> CameraFrame | None:
        time.sleep(self._period_s)
        T = self._flange_pose()
        moving = T is None or self._last_T is None or not _close(T, self._last_T, 1e-4, math.radians(0.05))
        self._last_T = T
        if moving or not self._board_visible:
            gray = self._blank
        else:
            if self._cached is None or not _close(T, self._cached[0], 2e-5, math.radians(0.02)):
                T_cam_from_board = self._T_cam_from_base @ T @ self._T_tcp_from_board
                self._cached = T, self._renderer.render(T_cam_from_board, INTRINSICS, rng=None)
            noisy = self._cached[1] + self._rng.normal(0.0, 1.5, self._blank.shape)
            gray = np.clip(np.rint(noisy), 0, 255).astype(np.uint8)
        self._n += 1
        return CameraFrame(image=np.repeat(gray[..., None], 3, axis=2), timestamp_ms=self._n * self._period_s * 1e3,
                           frame_number=self._n, received_s=time.monotonic())

    def _close(self) -> None:
        pass

    def __repr__(self) -> str:
        return "FlangeBoardCamera"


def _close(T_a, T_b, tol_m, tol_rad) -> bool:
    return (np.linalg.norm(T_a[:3, 3] - T_b[:3, 3]) <= tol_m
            and np.linalg.norm(matrix_to_rotvec(T_a[:3, :3] @ T_b[:3, :3].T)) <= tol_rad)


def _angle_deg(a, b) -> float:
    return math.degrees(math.acos(np.clip(a @ b / np.linalg.norm(a) / np.linalg.norm(b), -1.0, 1.0)))


# ----- the pose set (no robot) --------------------------------------------------------------------

@pytest.mark.parametrize("limits", [SafetyLimits(), SafetyLimits(**box_limits())], ids=["default", "home_box"])
def test_scripted_poses_stay_inside_the_limits_rotate_about_several_axes_and_face_the_camera(limits):
    margin_m = 0.02
    poses = calibration_poses(limits, 15, rng=3, camera_position_m=CAMERA_POSITION_M, margin_m=margin_m)

    assert len(poses) == 15
    for T in poses:
        assert pose_limit_problems(T, limits, margin_m=margin_m - 1e-9) == []
        assert orientation_excess_rad(T[:3, :3], limits, limits.orientation_margin_rad) == 0.0
    tilts = [_angle_deg(T[:3, 2], R_HOME[:, 2]) for T in poses]
    assert 15.0 - 1e-6 <= min(tilts) and max(tilts) <= 30.0 + 1e-6
    max_rotation_deg, axis_spread_deg = check_rotation_diversity(poses)
    assert max_rotation_deg > 30.0 and axis_spread_deg > 60.0  # rotations about many non-parallel axes
    centre = 0.5 * (np.asarray(limits.workspace_min_m) + np.asarray(limits.workspace_max_m))
    normal_tcp = R_HOME.T @ (CAMERA_POSITION_M - centre)
    assert max(_angle_deg(T[:3, :3] @ normal_tcp, CAMERA_POSITION_M - T[:3, 3]) for T in poses) <= 45.0
    again = calibration_poses(limits, 15, rng=3, camera_position_m=CAMERA_POSITION_M, margin_m=margin_m)
    assert all(np.array_equal(a, b) for a, b in zip(poses, again))


def test_scripted_poses_refuse_too_few_poses_and_a_window_too_narrow_to_tilt():
    with pytest.raises(ValueError, match="at least 5 poses"):
        calibration_poses(SafetyLimits(), 4)
    with pytest.raises(ValueError, match="max_tilt_rad=0.15"):
        calibration_poses(SafetyLimits(max_tilt_rad=0.15), 10)
    # a yaw window too narrow for the tilts asked: named as such, with or without a camera position
    narrow = SafetyLimits(max_tilt_rad=math.radians(45), max_yaw_rad=math.radians(1),
                          orientation_margin_rad=math.radians(0.5))
    for camera in (None, CAMERA_POSITION_M):
        with pytest.raises(ValueError, match="outside the orientation window.*max_yaw_rad=0.01745"):
            calibration_poses(narrow, 10, tilt_deg=(25, 40), camera_position_m=camera)


def test_a_pose_file_round_trips_and_a_bad_pose_is_named(tmp_path):
    poses = calibration_poses(SafetyLimits(), 6, rng=0)
    loaded = load_poses(save_poses(tmp_path / "poses.json", poses))
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(poses, loaded))

    bad = [T.tolist() for T in poses]
    bad[2] = np.asarray(bad[2]).T.tolist()  # stored transposed: last row is not [0, 0, 0, 1]
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match="pose 2"):
        load_poses(tmp_path / "bad.json")
    (tmp_path / "dict.json").write_text(json.dumps({"poses": bad}))
    with pytest.raises(ValueError, match="JSON list of 4x4"):
        load_poses(tmp_path / "dict.json")


# ----- on franky-sim --------------------------------------------------------------------------------

@pytest.fixture
def layer(franky_sim):
    """The homed arm on franky-sim behind a SafetyLayer whose box spans +/-8 cm around the home TCP
    (per test: libfranka serves one connection, and the command-line test makes its own)."""
    with connected_layer(franky_sim, **box_limits()) as safety:
        yield safety


@pytest.mark.slow
@needs_franky
def test_a_live_session_on_franky_sim_recovers_the_camera(layer, tmp_path):
    T_base_from_cam, T_tcp_from_board = true_setup()
    poses = calibration_poses(layer.limits, 10, rng=1, camera_position_m=CAMERA_POSITION_M)
    spec = SessionSpec(mode=Mode.EYE_TO_HAND, board=SPEC, intrinsics=INTRINSICS, ee_frame="tcp")
    layer.pop_clamp_counts()
    lines: list[str] = []
    start_s = time.monotonic()
    with FlangeBoardCamera([layer.arm], T_base_from_cam, T_tcp_from_board, seed=7) as camera:
        folder = collect_session(layer, camera, spec, poses, tmp_path / "session", settle_s=0.3, report=lines.append)
    collect_s = time.monotonic() - start_s

    assert [line.split(":")[0] for line in lines] == [f"pose {i + 1}/10" for i in range(10)], lines
    assert all("sample" in line for line in lines), lines
    counts = layer.pop_clamp_counts()
    # every step within the limits; pacing is not a limit on the step (a step to where franky is already
    # commanded returns at once, and the next one waits out min_step_interval_s)
    assert not any(n for kind, n in counts.items() if kind not in ("watchdog", "step_rate")), counts
    session = load_session(folder)
    assert [s.name for s in session.samples] == [f"{i:03d}" for i in range(10)]
    assert session.spec.ee_frame == "tcp"
    assert all(np.linalg.norm(s.T_base_from_ee[:3, 3] - T[:3, 3]) < 0.003 for s, T in zip(session.samples, poses))
    assert len(load_poses(folder / "planned_poses.json")) == 10

    # the folder is a normal session: the offline command solves it into the camera file the twin loads
    out = tmp_path / "camera.json"
    assert main(["handeye", "--session", str(folder), "--out", str(out)]) == 0
    from vla_envs.camera_file import load_camera_file

    camera_file = load_camera_file(out)
    assert (camera_file.width, camera_file.height) == (INTRINSICS.width, INTRINSICS.height)
    from calibration.transforms import transform_difference

    trans_mm, rot_deg = transform_difference(T_base_from_cam, camera_file.T_base_from_cam)
    report = json.loads(out.read_text())["calibration"]
    print(f"live session: {len(session.samples)} samples in {collect_s:.1f} s; camera recovered to {trans_mm:.3f} mm / "
          f"{rot_deg:.4f} deg by {report['method']} (residuals {report['residuals'][report['method']]})")
    assert trans_mm < 3.0 and rot_deg < 0.2
    board_mm, board_deg = transform_difference(T_tcp_from_board, np.asarray(report["T_ee_from_board"]), SPEC.center_m)
    assert board_mm < 3.0 and board_deg < 0.2


@needs_franky
def test_a_target_outside_the_box_is_refused_before_the_arm_moves(layer):
    before = layer.observation().T_base_from_tcp
    target = make_transform(R_HOME, HOME + [BOX_HALF_M + 0.05, 0.0, 0.0])
    with pytest.raises(PoseNotReachedError, match=r"outside the safety limits: x = 0\.437 m is above workspace_max_m"):
        move_to_pose(layer, target)
    assert np.linalg.norm(layer.observation().T_base_from_tcp[:3, 3] - before[:3, 3]) < 1e-3


@needs_franky
def test_a_target_not_reached_within_max_steps_is_an_error_saying_how_far(layer):
    target = make_transform(rotvec_to_matrix([0.0, math.radians(20.0), 0.0]) @ R_HOME, HOME + [0.0, 0.03, 0.0])
    with pytest.raises(PoseNotReachedError, match=r"within max_steps=1 steps: still \d+\.\d mm and \d+\.\d+ deg away"):
        move_to_pose(layer, target, max_steps=1)


@needs_franky
def test_too_few_detections_stop_the_session_with_the_frames_kept(layer, tmp_path):
    T_base_from_cam, T_tcp_from_board = true_setup()
    poses = calibration_poses(layer.limits, 5, rng=2, camera_position_m=CAMERA_POSITION_M)
    spec = SessionSpec(mode=Mode.EYE_TO_HAND, board=SPEC, intrinsics=INTRINSICS, ee_frame="tcp")
    with FlangeBoardCamera([layer.arm], T_base_from_cam, T_tcp_from_board, board_visible=False) as camera:
        with pytest.raises(TooFewSamplesError, match=r"detected at 0 of 1 poses so far \(4 left\).*board not detected"):
            collect_session(layer, camera, spec, poses, tmp_path / "session", settle_s=0.2)
    assert (tmp_path / "session" / "skipped" / "000.png").is_file()
    assert load_session(tmp_path / "session").samples == []


# ----- the command line -----------------------------------------------------------------------------

def run_cli(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path):
    board = SPEC.save(tmp_path / "board.json")
    intrinsics = tmp_path / "intrinsics.json"
    intrinsics.write_text(json.dumps(INTRINSICS.to_dict()))
    outside = calibration_poses(SafetyLimits(), 6, rng=0)
    outside[3] = make_transform(R_HOME, [0.9, 0.0, 0.3])
    save_poses(tmp_path / "outside.json", outside)
    (tmp_path / "dry.json").write_text(json.dumps({"dry_run": True}))
    recorded = tmp_path / "recorded"
    recorded.mkdir()
    (recorded / "session.json").write_text("{}")
    return {"board": str(board), "intrinsics": str(intrinsics), "outside": str(tmp_path / "outside.json"),
            "dry": str(tmp_path / "dry.json"), "recorded": str(recorded), "out": str(tmp_path / "camera.json"),
            "new": str(tmp_path / "new_session")}


LIVE = ["--robot-ip", "127.0.0.1", "--camera-serial", "000000000000"]


@pytest.mark.parametrize("argv, flag", [
    (["--out", "{out}"], "--session"),
    (["--session", "{recorded}", "--robot-ip", "127.0.0.1", "--out", "{out}"], "--session"),
    (["--session", "{recorded}", "--board", "{board}", "--out", "{out}"], "--board"),
    (["--robot-ip", "127.0.0.1", "--board", "{board}", "--session-dir", "{new}", "--out", "{out}"], "--camera-serial"),
    ([*LIVE, "--session-dir", "{new}", "--out", "{out}"], "--board"),
    ([*LIVE, "--board", "{board}", "--out", "{out}"], "--session-dir"),
    ([*LIVE, "--board", "{board}", "--session-dir", "{recorded}", "--out", "{out}"], "--session-dir"),
    ([*LIVE, "--board", "{board}", "--session-dir", "{new}", "--num-poses", "3", "--out", "{out}"], "--num-poses"),
    ([*LIVE, "--board", "{board}", "--session-dir", "{new}", "--poses", "{outside}", "--out", "{out}"], "--poses"),
    ([*LIVE, "--board", "{board}", "--session-dir", "{new}", "--safety-limits", "{dry}", "--out", "{out}"],
     "--safety-limits"),
    ([*LIVE, "--board", "{board}", "--session-dir", "{new}", "--relative-dynamics", "0.5", "--out", "{out}"],
     "--relative-dynamics"),
    ([*LIVE, "--playback", "{board}", "--board", "{board}", "--session-dir", "{new}", "--out", "{out}"],
     "--playback"),
], ids=["nothing", "both", "live-arg-offline", "no-camera", "no-board", "no-session-dir", "session-dir-used",
        "too-few-poses", "pose-outside", "dry-run-limits", "too-fast", "camera-twice"])
def test_bad_live_arguments_exit_2_naming_them(argv, flag, files, capsys):
    code, out, err = run_cli(["handeye", *[a.format(**files) for a in argv]], capsys)
    assert code == 2, (out, err)
    assert flag in err, err
    assert not Path(files["new"]).exists()  # refused before anything was recorded


@pytest.mark.parametrize("content, message", [(b"\xda\x00\xff binary", "is not a text file"),
                                              (b"workspace_min_m: [0.3\n", "is not valid YAML (line 2: ")],
                         ids=["binary", "yaml-syntax"])
def test_a_safety_limits_file_that_is_not_a_mapping_exits_2_naming_it(content, message, files, tmp_path, capsys):
    limits = tmp_path / "garbage.yaml"
    limits.write_bytes(content)
    code, out, err = run_cli(["handeye", *[a.format(**files) for a in LIVE], "--board", files["board"],
                              "--session-dir", files["new"], "--safety-limits", str(limits), "--out", files["out"]],
                             capsys)
    assert code == 2, (out, err)
    assert f"argument --safety-limits: {limits} {message}" in err and "mapping of limit names" in err
    assert not Path(files["new"]).exists()


@needs_realsense
def test_a_missing_camera_exits_1_naming_its_serial_before_the_robot_is_contacted(files, capsys):
    code, out, err = run_cli(["handeye", "--robot-ip", free_loopback_address(), "--camera-serial", "000000000000",
                              "--board", files["board"], "--intrinsics", files["intrinsics"], "--session-dir",
                              files["new"], "--out", files["out"]], capsys)
    assert code == 1, (out, err)
    assert "no RealSense camera with serial '000000000000'" in err


@needs_franky
@needs_realsense
def test_an_unreachable_robot_exits_1_naming_its_address(files, tmp_path, capsys):
    from real_robot.realsense import write_recording

    recording = write_recording(tmp_path / "board.db3", [np.full((480, 640, 3), 128, np.uint8)] * 4)
    address = free_loopback_address()
    code, out, err = run_cli(["handeye", "--robot-ip", address, "--playback", str(recording), "--ignore-realtime",
                              "--board", files["board"], "--session-dir", files["new"], "--out", files["out"]],
                             capsys)
    assert code == 1, (out, err)
    assert f"cannot connect to the robot at {address}" in err
    assert "factory intrinsics of RealSenseCamera(playback board.db3): 640x480, fx 640.00" in out


@pytest.mark.slow
@needs_franky
def test_the_live_command_homes_collects_solves_and_writes_the_camera_file(franky_sim, files, tmp_path, monkeypatch,
                                                                           capsys):
    """``vla-calibrate handeye --robot-ip`` end to end on franky-sim; only the RealSense is replaced by the
    rendering camera (it renders the flange of the arm the command connects)."""
    import real_robot.franky_arm
    import real_robot.realsense

    T_base_from_cam, T_tcp_from_board = true_setup()
    arms: list = []

    class TrackedArm(real_robot.franky_arm.FrankyArm):
        def connect(self, timeout_s=None):
            super().connect(timeout_s)
            arms.append(self)

    monkeypatch.setattr(real_robot.franky_arm, "FrankyArm", TrackedArm)
    monkeypatch.setattr(real_robot.realsense, "RealSenseCamera",
                        lambda config: FlangeBoardCamera(arms, T_base_from_cam, T_tcp_from_board, seed=11))
    limits = tmp_path / "limits.json"
    limits.write_text(json.dumps({**{k: list(v) for k, v in box_limits().items()}, "max_relative_dynamics_factor": 0.5,
                                  "max_translation_per_step_m": 0.05, "max_rotation_per_step_rad": 0.1}))
    code, out, err = run_cli(["handeye", "--robot-ip", franky_sim, "--ignore-realtime", "--camera-serial", "1234",
                              "--board", files["board"], "--intrinsics", files["intrinsics"], "--num-poses", "6",
                              "--camera-position", *map(str, CAMERA_POSITION_M), "--safety-limits", str(limits),
                              "--relative-dynamics", "0.5", "--settle-s", "0.3", "--session-dir", files["new"],
                              "--out", files["out"]], capsys)
    assert code == 0, (out, err)
    assert "6 poses, TCP x " in out and "The arm homes, visits each pose, and homes again" in out
    assert [f"pose {i}/6: sample" in out for i in range(1, 7)] == [True] * 6, out
    assert "PASS: " in out
    from calibration.transforms import transform_difference
    from vla_envs.camera_file import load_camera_file

    trans_mm, rot_deg = transform_difference(T_base_from_cam, load_camera_file(files["out"]).T_base_from_cam)
    with capsys.disabled():
        print(f"live command, 6 poses: camera recovered to {trans_mm:.3f} mm / {rot_deg:.4f} deg")
    assert trans_mm < 3.0 and rot_deg < 0.2
    assert len(arms) == 1 and not arms[0].is_connected
