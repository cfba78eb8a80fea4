"""``franka-eval`` end to end: the shipped warm start drives franky-sim (real libfranka protocol)
through the safety layer, with the camera played back from a RealSense recording through
``rs.pipeline``; plus the checks that stop it before anything moves."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from shipped_paths import SHIPPED_WARM_START

from real_robot.safety import SafetyLimits
from vla_trainer.deploy.fit import CheckpointMismatchError, check_fit
from vla_trainer.deploy.franka_eval import main, summary
from vla_trainer.deploy.serve import PolicySpec

SPEC = PolicySpec(image_size=64, state_dim=16, chunk_size=8, action_dim=7, camera_crop=(190, 80, 460, 350),
                  model_dir="m")


def test_a_checkpoint_that_does_not_fit_the_env_is_named_on_both_sides():
    assert check_fit(SPEC, image_size=None, camera_crop=None, state_dim=16) == (64, (190, 80, 460, 350))
    with pytest.raises(CheckpointMismatchError, match="reads 64 px.*128 px were asked for"):
        check_fit(SPEC, image_size=128, camera_crop=None, state_dim=16)
    with pytest.raises(CheckpointMismatchError, match=r"crop \(190, 80, 460, 350\).*\(0, 0, 640, 480\)"):
        check_fit(SPEC, image_size=None, camera_crop=(0, 0, 640, 480), state_dim=16)
    with pytest.raises(CheckpointMismatchError, match="9-wide state.*16"):
        check_fit(PolicySpec(64, 9, 8, 7, None, "m"), image_size=None, camera_crop=None, state_dim=16)
    with pytest.raises(CheckpointMismatchError, match="6-D actions"):
        check_fit(PolicySpec(64, 16, 8, 6, None, "m"), image_size=None, camera_crop=None, state_dim=16)
    # LIBERO's actions are robosuite's, not the Panda twin's
    with pytest.raises(CheckpointMismatchError, match="trained on libero_130, whose actions are LIBERO's"):
        check_fit(PolicySpec(64, 0, 8, 7, None, "m", task="libero_130"), image_size=None, camera_crop=None, state_dim=16)
    assert check_fit(PolicySpec(64, 0, 8, 7, None, "m", task="PutOnPlateInScene25Main-v3"), image_size=None,
                     camera_crop=None, state_dim=16) == (64, None)
    # a crop in pixels of the training camera's 640x480 images means another view at 1280x720
    spec = PolicySpec(64, 16, 8, 7, (190, 80, 460, 350), "m", camera_hw=(480, 640))
    assert check_fit(spec, image_size=None, camera_crop=None, state_dim=16, camera_hw=(480, 640))[1] == spec.camera_crop
    with pytest.raises(CheckpointMismatchError, match=r"training camera's 640x480 images; the camera file gives 1280x720"):
        check_fit(spec, image_size=None, camera_crop=None, state_dim=16, camera_hw=(720, 1280))


def test_the_policys_device_is_an_option_checked_before_anything_loads(capsys):
    """A GPU checkpoint ran on CUDA only through ros2 launch (its device argument); --ros had none."""
    import torch

    from vla_trainer.deploy.franka_eval import parse_args, ros_specs

    base = ["--checkpoint", "ckpt", "--robot-ip", "172.16.0.2", "--camera-serial", "1", "--instruction", "x", "--ros"]
    policy = {s.name: s for s in ros_specs(parse_args(base + ["--device", "cpu"]), None)}["policy"]
    assert policy.parameters["device"] == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            parse_args(base + ["--device", "cuda"])
        assert e.value.code == 2 and "'cuda': no CUDA GPU here" in capsys.readouterr().err


def test_the_summary_has_both_success_notions_with_intervals():
    rows = [{"label": "success", "success_once": 1.0, "success_at_end": 1.0, "clamp_workspace": 2.0},
            {"label": "failure", "success_once": 1.0, "success_at_end": 0.0, "clamp_workspace": 0.0},
            {"label": "time_limit", "success_once": 0.0, "success_at_end": 0.0, "clamp_workspace": 1.0}]
    table, numbers = summary(rows)
    assert numbers["success_once"]["successes"] == 2 and numbers["success_at_end"]["successes"] == 1
    lo, hi = numbers["success_once"]["interval_95"]
    assert 0.0 < lo < 2 / 3 < hi < 1.0
    assert numbers["safety_clamps"] == {"clamp_workspace": 3}
    assert "success_at_end | 1/3 = 33.3 %" in table and "workspace 3" in table


def _camera_file(tmp_path: Path) -> Path:
    """A 64x48 camera (the default one's pose, its intrinsics scaled): recordings stay small."""
    default = json.loads((Path(__file__).resolve().parents[2] / "vla_envs/default_camera.json")
                         .read_text())
    k = np.array(default["intrinsic"]) * 0.1
    k[2, 2] = 1.0
    path = tmp_path / "camera.json"
    path.write_text(json.dumps({**default, "width": 64, "height": 48, "intrinsic": k.tolist()}))
    return path


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    from real_robot.realsense import write_recording

    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(150)]
    return write_recording(tmp_path_factory.mktemp("rec") / "cell.db3", frames, fps=15)


def _args(franky_sim, recording, tmp_path, *extra):
    limits = tmp_path / "limits.yaml"
    limits.write_text("workspace_min_m: [0.35, -0.3, 0.08]\nworkspace_max_m: [0.85, 0.3, 0.5]\n"
                      "max_relative_dynamics_factor: 0.5\nwatchdog_timeout_s: 5.0\ngripper_min_interval_s: 0.0\n")
    return ["--checkpoint", str(SHIPPED_WARM_START), "--robot-ip", franky_sim, "--playback", str(recording),
            "--instruction", "put carrot on plate", "--episodes", "1", "--time-limit", "6",
            "--camera-file", str(_camera_file(tmp_path)), "--camera-crop", "0,0,64,48", "--operator", "scripted",
            "--ignore-realtime", "--relative-dynamics", "0.5", "--safety-limits", str(limits),
            "--out", str(tmp_path / "out"), *extra]


def _no_crop_model(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    for f in SHIPPED_WARM_START.iterdir():
        if f.name != "made_by.json" and not (model / f.name).exists():
            (model / f.name).symlink_to(f)
    return model


def _without_crop(args: list[str], model: Path) -> list[str]:
    i = args.index("--camera-crop")
    args = args[:i] + args[i + 2:]
    args[args.index("--checkpoint") + 1] = str(model)
    return args


@pytest.mark.slow
def test_one_episode_on_franky_sim_is_run_recorded_and_reported(franky_sim, recording, tmp_path, capsys):
    from vla_envs.demos import load_demos

    # the warm start records its crop (190, 80, 460, 350) of a 640x480 camera: this cell's camera
    # is 64x48, so the crop is given and must be refused as not the checkpoint's ...
    assert main(_args(franky_sim, recording, tmp_path)) == 2
    assert "camera crop" in capsys.readouterr().err
    # ... a checkpoint that records no crop (the warm start without its made_by.json) runs on it
    assert main(_without_crop(_args(franky_sim, recording, tmp_path), _no_crop_model(tmp_path))) == 0, \
        capsys.readouterr().err
    out = tmp_path / "out"
    numbers = json.loads((out / "results.json").read_text())
    assert numbers["episodes"] == 1 and set(numbers["success_once"]) == {"successes", "rate", "interval_95"}
    index, episodes = load_demos(out / "episodes")
    assert index["episodes"][0]["label"] == "time_limit" and index["episodes"][0]["length"] == 6
    ep = episodes[0]
    assert ep["action"].shape == (6, 7) and ep["image"].shape == (6, 64, 64, 3) and ep["state"].shape == (6, 16)
    assert np.all(np.abs(ep["action"][:, :6]) <= 1.0 + 1e-5)  # the twin's convention, after the safety limits
    assert "success_once" in capsys.readouterr().out


@pytest.mark.parametrize("bad", [{"instruction": ""}, {"chunk_reset": "bogus"}])
def test_a_bad_option_after_connecting_releases_the_arm_camera_and_watchdog(franky_sim, recording, tmp_path, bad):
    import threading

    from vla_envs.backends.franka.make import make_franka_vector_env

    kwargs = dict(instruction="put carrot on plate", robot_ip=franky_sim, playback_file=str(recording),
                  camera_file=_camera_file(tmp_path), operator="scripted", ignore_realtime=True,
                  relative_dynamics_factor=0.5, safety_limits=SafetyLimits(max_relative_dynamics_factor=0.5))
    with pytest.raises(ValueError, match="instruction|chunk_reset"):
        make_franka_vector_env(**{**kwargs, **bad})
    alive = [t.name for t in threading.enumerate() if t.name == "safety-watchdog" or t.name.endswith("-reader")]
    assert alive == []
    env = make_franka_vector_env(**kwargs)  # the arm and the camera are free again
    assert env.backend.undistort is None  # a pinhole camera file: frames taken as they are
    env.close()
    distorted = json.loads(kwargs["camera_file"].read_text())
    kwargs["camera_file"].write_text(json.dumps({**distorted, "calibration": {"dist_coeffs": [-0.2, 0.05, 0, 0, 0]}}))
    env = make_franka_vector_env(**kwargs)
    assert env.backend.undistort is not None  # each frame undistorted before the crop (test_calibration_camera_file)
    env.close()


@pytest.mark.reliability(fault='a second Ctrl-C while franka-eval closes the env (franky-sim)', cases=1,
                         outcome='the arm is stopped, it and the camera released; the interrupt raised after')
def test_a_ctrl_c_while_closing_still_releases_the_arm_and_the_camera(franky_sim, recording, tmp_path,
                                                                      ctrl_c_raises):
    import signal
    import threading

    from vla_envs.backends.franka.make import make_franka_vector_env

    env = make_franka_vector_env(instruction="put carrot on plate", robot_ip=franky_sim, playback_file=str(recording),
                                 camera_file=_camera_file(tmp_path), operator="scripted", ignore_realtime=True)
    arm = env.backend.safety.arm
    real_stop = arm.stop

    def interrupted_stop():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler here, before the stop is sent
        real_stop()

    arm.stop = interrupted_stop
    with pytest.raises(KeyboardInterrupt):
        env.close()
    assert not arm.is_connected
    assert [t.name for t in threading.enumerate() if t.name == "safety-watchdog" or t.name.endswith("-reader")] == []


@pytest.mark.slow
def test_labelled_episodes_are_recorded_step_by_step_and_sft_trains_on_successes_only(franky_sim, recording,
                                                                                       tmp_path):
    import argparse

    from vla_envs.backends.franka.make import make_franka_vector_env
    from vla_envs.backends.franka.operator import ScriptedOperator
    from vla_envs.demos import load_demos
    from vla_trainer.data import build_samples
    from vla_trainer.deploy.franka_eval import run_episodes
    from vla_trainer.deploy.serve import PolicyService

    policy = PolicyService(_no_crop_model(tmp_path))
    args = argparse.Namespace(episodes=1, instruction="put carrot on plate")
    for run, label in (("success", "success"), ("failure", "failure"), ("dry", "success")):
        env = make_franka_vector_env(
            instruction=args.instruction, robot_ip=franky_sim, playback_file=str(recording),
            camera_file=_camera_file(tmp_path), operator=ScriptedOperator(label, after_steps=3), ignore_realtime=True,
            relative_dynamics_factor=0.5, safety_limits=SafetyLimits(max_relative_dynamics_factor=0.5,
                                                                     gripper_min_interval_s=0.0),
            dry_run=run == "dry")
        rows = []
        try:
            run_episodes(env, policy, args, tmp_path / run, rows)
        finally:
            env.close()
        assert [r["label"] for r in rows] == [label]
        index, (episode,) = load_demos(tmp_path / run / "episodes")
        assert index["episodes"][0].get("dry_run", False) == (run == "dry")
        assert index["episodes"][0]["length"] == 3 == len(episode["action"])
        assert index["env_kwargs"] == {"image_size": 64, "camera_crop": None}  # what SFT on them records
        # the per-step record agrees with the episode's: the operator's success lands on the last step
        np.testing.assert_array_equal(episode["success"], [False, False, label == "success"])
        np.testing.assert_array_equal(episode["reward"], [0, 0, float(label == "success")])
    # the failed episode's steps are not trained on, nor the dry run's (its actions never ran)
    with pytest.warns(UserWarning, match="1 of 1 episodes were recorded in a dry run"):
        samples = build_samples([tmp_path / run / "episodes" for run in ("success", "failure", "dry")], chunk_size=8)
    assert len(samples.action_chunk) == 3
    with pytest.raises(ValueError, match="no successful episodes"):
        build_samples(tmp_path / "failure" / "episodes", chunk_size=8)


@pytest.mark.slow
def test_an_episode_through_the_robots_ros2_stack(franky_sim, recording, tmp_path, capsys):
    """``--ros-arm``: the same run with the arm reached through a franka_ros2-style stack's topics
    (``ros_franka_stack.py`` on franky-sim) instead of franky."""
    pytest.importorskip("rclpy", reason="the ros extra: bash scripts/setup.sh dev,robot,ros")
    import yaml

    from ros_franka_stack import ros_arm_config, start_stack

    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the realtime priority franky left here
    config = ros_arm_config()
    arm_file = tmp_path / "ros_arm.yaml"
    arm_file.write_text(yaml.safe_dump({k: getattr(config, k) for k in (
        "gripper", "error_recovery_action", "domain_id", "relative_dynamics_factor", "connect_timeout_s")}))
    args = _without_crop(_args(franky_sim, recording, tmp_path), _no_crop_model(tmp_path))
    args[args.index("--robot-ip"):args.index("--robot-ip") + 2] = ["--ros-arm", str(arm_file)]
    with start_stack(franky_sim, tmp_path / "stack.log"):
        assert main(args) == 0, capsys.readouterr().err
    assert f"the real Franka at {arm_file}" in capsys.readouterr().out
    numbers = json.loads((tmp_path / "out" / "results.json").read_text())
    assert numbers["episodes"] == 1
    from vla_envs.demos import load_demos

    index, episodes = load_demos(tmp_path / "out" / "episodes")
    assert index["episodes"][0]["length"] == 6 and episodes[0]["state"].shape == (6, 16)
    # it started at the twin's rest pose: homed by the stack's joint trajectory controller
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD

    np.testing.assert_allclose(episodes[0]["state"][0, :7], TWIN_REST_JOINT_POSITIONS_RAD, atol=0.02)


def test_an_unreachable_robot_fails_fast_naming_it(recording, tmp_path, capsys, free_address):
    t0 = time.monotonic()
    args = _without_crop(_args(free_address, recording, tmp_path, "--image-size", "64"), _no_crop_model(tmp_path))
    assert main(args) == 2
    assert time.monotonic() - t0 < 15  # loading the policy included; the connect itself fails in ms
    assert free_address in capsys.readouterr().err


@pytest.mark.slow
def test_a_camera_that_stops_sending_stops_the_episode(franky_sim, tmp_path, capsys):
    from real_robot.realsense import write_recording

    short = write_recording(tmp_path / "short.db3", [np.zeros((48, 64, 3), np.uint8)] * 10, fps=15)
    args = _without_crop(_args(franky_sim, short, tmp_path, "--time-limit", "60"), _no_crop_model(tmp_path))
    assert main(args) == 2
    assert "ms old" in capsys.readouterr().err  # the stale frame is named, the arm stopped


@pytest.mark.slow
def test_sigint_mid_episode_stops_the_arm_and_exits_130(franky_sim, recording, tmp_path):
    import os
    import signal
    import subprocess
    import sys

    args = _without_crop(_args(franky_sim, recording, tmp_path, "--time-limit", "12"), _no_crop_model(tmp_path))
    args[args.index("--episodes") + 1] = "2"
    exe = Path(sys.executable).with_name("franka-eval")
    # a terminal's foreground job gets Ctrl-C; a suite started in the background (``&``) ignores
    # SIGINT, and its children would inherit that and never see this one
    proc = subprocess.Popen([str(exe), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"},
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        for line in proc.stdout:  # wait until the second episode runs
            if "episode 2/2: running" in line:
                break
        time.sleep(1.0)
        proc.send_signal(signal.SIGINT)
        try:  # about 2 s
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            pytest.fail(f"franka-eval did not exit 30 s after SIGINT; its stderr:\n{proc.communicate()[1][-4000:]}")
        assert code == 130
        assert "the arm was stopped" in proc.stderr.read()
        numbers = json.loads((tmp_path / "out" / "results.json").read_text())  # the finished episode's table
        assert numbers["episodes"] == 1 and numbers["stopped_early"] is True
        assert "1 of 2 episodes" in (tmp_path / "out" / "results.md").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    from real_robot.franky_arm import FrankyArm, FrankyArmConfig

    with FrankyArm(FrankyArmConfig(robot_ip=franky_sim, ignore_realtime=True)) as arm:
        time.sleep(0.5)  # franky-sim's joints lag its command by about 0.3 s
        p0 = arm.observation().tcp_position_m
        time.sleep(0.5)
        assert np.linalg.norm(arm.observation().tcp_position_m - p0) < 1e-3  # holding still


@pytest.mark.parametrize("size", [(640, 480), (848, 480)])
def test_the_drift_check_runs_before_the_robot_is_touched(size, tmp_path, free_address, capsys):
    """A camera that moved since calibration stops franka-eval (exit 3) before it connects to the
    robot; ``--drift-override`` goes on (here to the unreachable robot: exit 2 naming it). The check
    opens the camera at the calibrated resolution, as the episodes do (not the camera's default)."""
    import cv2

    from calibration.board import BoardSpec
    from calibration.camera_file import write_camera_file
    from calibration.drift import pin_reference
    from calibration.synthetic import BoardRenderer, default_intrinsics, look_at
    from calibration.transforms import make_transform, rotvec_to_matrix
    from real_robot.realsense import write_recording

    spec, intrinsics = BoardSpec(), default_intrinsics(*size)
    R = rotvec_to_matrix(np.radians([35.0, 0.0, 8.0]))
    T_ref = make_transform(R, np.array([0.02, 0.01, 0.50]) - R @ spec.center_m)
    T_moved = make_transform(rotvec_to_matrix(np.radians([0.0, 1.5, 0.0])), [0.01, 0.0, 0.0]) @ T_ref
    renderer, rng = BoardRenderer(spec), np.random.default_rng(0)
    camera_file = write_camera_file(tmp_path / "camera.json", intrinsics=intrinsics,
                                    T_base_from_cam=look_at([1.0, -0.4, 0.6], [0.45, 0.0, 0.1]))
    ref_image = cv2.cvtColor(renderer.render(T_ref, intrinsics, rng, noise_std=1.0), cv2.COLOR_GRAY2RGB)
    pin_reference(tmp_path / "drift", camera_file, ref_image, spec)
    moved = cv2.cvtColor(renderer.render(T_moved, intrinsics, rng, noise_std=1.0), cv2.COLOR_GRAY2RGB)
    rec = write_recording(tmp_path / "moved.db3", [moved] * 4, fps=30)
    args = ["--checkpoint", str(_no_crop_model(tmp_path)), "--robot-ip", free_address, "--playback", str(rec),
            "--instruction", "put carrot on plate", "--camera-file", str(camera_file), "--operator", "scripted",
            "--drift-reference", str(tmp_path / "drift"), "--out", str(tmp_path / "out")]
    assert main(args) == 3
    assert "camera moved since calibration" in capsys.readouterr().err
    assert main([*args, "--drift-override"]) == 2
    assert free_address in capsys.readouterr().err


@pytest.mark.slow
def test_ros_mode_starts_the_same_nodes_and_stops_them_all(franky_sim, recording, tmp_path):
    """``franka-eval --ros``: the camera, policy and bridge nodes from the launch file's spec, started
    without the ROS 2 CLI, run against franky-sim (dry run) and are all stopped at the end."""
    pytest.importorskip("rclpy", reason="needs the [ros] extra")
    import subprocess

    args = _without_crop(_args(franky_sim, recording, tmp_path, "--dry-run", "--ros", "--ros-seconds", "12",
                               "--ros-domain-id", str(100 + os.getpid() % 100)), _no_crop_model(tmp_path))
    assert main(args) == 0
    logs = tmp_path / "out" / "ros_logs"
    assert sorted(p.name for p in logs.iterdir()) == ["camera.log", "franka_bridge.log", "policy.log"]
    assert "dry run: nothing moves" in (logs / "franka_bridge.log").read_text()
    assert "publishing" in (logs / "camera.log").read_text()
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True).stdout.split()
    assert left == [], "node processes left running"


def _unused(*args, **kwargs):
    raise AssertionError("the checkpoint was loaded although an argument was bad")


@pytest.mark.parametrize("flag, make, message", [
    ("--camera-file", lambda p: p.write_bytes(b"\xda\x00\xff binary"), "--camera-file: camera file {path} is not valid JSON"),
    ("--camera-file", lambda p: p.mkdir(), "--camera-file {path} is a folder; give a camera file"),
    ("--safety-limits", lambda p: p.write_text("workspace_min_m: [0.3\n"), "--safety-limits: {path} is not valid YAML"),
    ("--safety-limits", lambda p: p.mkdir(), "--safety-limits {path} is a folder"),
    ("--ros-arm", lambda p: p.mkdir(), "--ros-arm {path} is a folder; give a RosArmConfig YAML file"),
], ids=["camera-binary", "camera-folder", "limits-yaml", "limits-folder", "ros-arm-folder"])
def test_a_file_that_cannot_be_read_is_named_with_its_flag_before_loading(flag, make, message, tmp_path, monkeypatch,
                                                                          capsys):
    import vla_trainer.deploy.serve as serve

    monkeypatch.setattr(serve, "PolicyService", _unused)
    path = tmp_path / "given.yaml"
    make(path)
    args = ["--checkpoint", "m", "--playback", "scene.db3", "--instruction", "put carrot on plate",
            "--robot-ip", "10.255.255.1", flag, str(path)]
    if flag == "--ros-arm":
        del args[6:8]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message.format(path=path)) and len(err.splitlines()) == 1, err


@pytest.mark.parametrize("extra, flag", [(["--ros", "--ros-seconds", "-1"], "--ros-seconds"),
                                         (["--relative-dynamics", "0"], "--relative-dynamics"),
                                         (["--relative-dynamics", "1.5"], "--relative-dynamics")])
def test_out_of_range_numbers_are_refused_by_flag(extra, flag, monkeypatch, capsys):
    import vla_trainer.deploy.serve as serve

    monkeypatch.setattr(serve, "PolicyService", _unused)
    with pytest.raises(SystemExit) as e:
        main(["--checkpoint", "m", "--robot-ip", "10.255.255.1", "--playback", "scene.db3", "--instruction", "x",
              *extra])
    assert e.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def test_no_realtime_kernel_names_the_flag_that_skips_it(tmp_path, monkeypatch, capsys):
    import vla_envs.backends.franka.make as make
    import vla_trainer.deploy.serve as serve
    from real_robot.errors import RealtimeKernelError

    class Service:
        spec = PolicySpec(image_size=64, state_dim=16, chunk_size=8, action_dim=7, camera_crop=None, model_dir="m")

    def no_realtime(**kwargs):
        raise RealtimeKernelError("libfranka: Running kernel does not have realtime capabilities.")

    monkeypatch.setattr(serve, "PolicyService", lambda *args, **kwargs: Service())
    monkeypatch.setattr(make, "make_franka_vector_env", no_realtime)
    assert main(["--checkpoint", "m", "--robot-ip", "10.255.255.1", "--playback", "scene.db3", "--instruction", "x",
                 "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no realtime kernel" in err and "pass --ignore-realtime" in err and "ignore_realtime=True" not in err


@pytest.mark.reliability(fault="franka-eval into a folder holding an earlier run's real episodes, or into a file", cases=2,
                         outcome="refused before the checkpoint loads; the episodes untouched")
def test_an_out_folder_holding_earlier_episodes_is_refused_before_loading(tmp_path, monkeypatch, capsys):
    import vla_trainer.deploy.serve as serve
    from synthetic_demos import write_demos

    monkeypatch.setattr(serve, "PolicyService", _unused)
    write_demos(tmp_path / "earlier" / "episodes")
    kept = sorted(p.name for p in (tmp_path / "earlier" / "episodes").iterdir())
    (tmp_path / "a_file").write_text("x")
    base = ["--checkpoint", "m", "--robot-ip", "10.255.255.1", "--playback", "scene.db3", "--instruction", "x"]
    for out, says in (("earlier", "holds the episodes of an earlier run"), ("a_file", "is a file")):
        assert main([*base, "--out", str(tmp_path / out)]) == 2
        assert f"error: --out {tmp_path / out} {says}" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "earlier" / "episodes").iterdir()) == kept
