"""Control-loop latency on the robot side, from frame capture to command sent, with the shipped
tiny policy on this CPU against franky-sim (the real libfranka protocol over loopback) and the
camera played back through ``rs.pipeline``.

Per policy call: camera (newest frame), preprocess (arm state read + the twin's crop/resize and
state layout), policy (one chunk), safety (limits, in dry-run: no arm command), send (safety + the
absolute target sent without waiting for the motion). At 5 Hz a period is 200 ms; the target is
p95 < 100 ms.

``--arm ros`` reads and commands the arm through ROS 2 topics (``RosArm``) of the franka_ros2-style
stand-in of the tests (``tests/robot/ros_franka_stack.py``), which drives the same franky-sim.

    .venv/bin/python bench/control_latency.py [--calls 60] [--arm ros]   # needs: bash scripts/setup.sh ...,robot,ros
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def start_franky_sim(host: str) -> subprocess.Popen:
    exe = Path(os.environ.get("VLA_FRANKY_SIM_VENV", ROOT / ".venv-franky-sim")) / "bin" / "franky-sim"
    if not exe.exists():
        sys.exit(f"franky-sim is not installed ({exe}); run: bash scripts/setup.sh maniskill,libero,dev,robot")
    proc = subprocess.Popen([str(exe), "--simulator", "mujoco", "--hostname", host], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex((host, 1337)) == 0:
                time.sleep(0.5)
                return proc
        time.sleep(0.1)
    proc.kill()
    sys.exit("franky-sim did not start within 30 s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=60)
    p.add_argument("--arm", choices=("franky", "ros"), default="franky",
                   help="franky: libfranka directly; ros: RosArm over a franka_ros2-style stack's topics")
    args = p.parse_args()

    from real_robot.franky_arm import FrankyArm, FrankyArmConfig
    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig, write_recording
    from real_robot.safety import SafetyLayer, SafetyLimits
    from vla_envs.backends.franka.twin import (TWIN_REST_JOINT_POSITIONS_RAD, twin_image, twin_scaled_action,
                                               twin_state)
    from vla_trainer.deploy.serve import PolicyService

    host = f"127.{100 + os.getpid() % 100}.7.{1 + os.getpid() % 250}"
    sim = start_franky_sim(host)
    tmp = Path(tempfile.mkdtemp())
    try:
        rng = np.random.default_rng(0)
        service = PolicyService(ROOT / "warm_start" / "tiny-openvla-oft-put-on-plate")
        # full-size 640x480 frames at 6 fps (a RealSense mode), long enough for the loop and homing
        frames = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(int((args.calls * 0.2 + 8) * 6))]
        rec = write_recording(tmp / "loop.db3", frames, fps=6)
        limits = SafetyLimits(workspace_min_m=(0.35, -0.3, 0.08), workspace_max_m=(0.85, 0.3, 0.5),
                              max_relative_dynamics_factor=0.5, watchdog_timeout_s=5.0, gripper_min_interval_s=0.0,
                              home_joint_positions_rad=TWIN_REST_JOINT_POSITIONS_RAD)
        times: dict[str, list[float]] = {k: [] for k in ("camera", "preprocess", "policy", "safety", "send", "total")}
        with contextlib.ExitStack() as stack:
            if args.arm == "franky":
                arm = FrankyArm(FrankyArmConfig(robot_ip=host, ignore_realtime=True, relative_dynamics_factor=0.5,
                                                wait_for_motion=False))
            else:
                sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "robot")]  # the stand-in and its helpers
                from real_robot.ros_arm import RosArm
                from ros_franka_stack import ros_arm_config, start_stack

                stack.enter_context(start_stack(host, tmp / "ros_stack.log"))
                arm = RosArm(ros_arm_config(wait_for_motion=False))
            camera = stack.enter_context(RealSenseCamera(RealSenseCameraConfig(playback_file=str(rec))))
            stack.enter_context(arm)
            safety = stack.enter_context(SafetyLayer(arm, limits))
            safety.home()
            dry = dataclasses.replace(limits, dry_run=True)
            crop = service.spec.camera_crop
            for i in range(args.calls):
                t0 = time.perf_counter()
                frame = camera.read_latest(max_age_ms=400)
                t1 = time.perf_counter()
                reading = safety.observation()
                image = twin_image(frame.image, service.spec.image_size, crop, (480, 640))
                state = twin_state(reading.joint_positions_rad, reading.gripper_width_m, reading.T_base_from_tcp)
                t2 = time.perf_counter()
                chunk = service.act(image, "put carrot on plate", state)
                t3 = time.perf_counter()
                action = twin_scaled_action(chunk[0])
                # the dry run's check must not count as having changed the gripper: the real send below
                # would then skip the gripper command, the slow path this row is to include
                gripper = (safety._gripper_closed, safety._gripper_changed_s)
                safety.limits = dry
                safety.send_action(action)
                t4 = time.perf_counter()
                safety.limits = limits
                safety._gripper_closed, safety._gripper_changed_s = gripper
                safety.send_action(action)
                t5 = time.perf_counter()
                for key, value in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, (t1 - t0) + (t2 - t1)
                                              + (t3 - t2) + (t5 - t4))):
                    times[key].append(value * 1000)
                time.sleep(max(0.0, 0.2 - (time.perf_counter() - t0)))
        print(f"{args.calls} policy calls (tiny OFT, CPU, chunk {service.spec.chunk_size}, arm: {args.arm}); ms per call:")
        print("| stage | median | p95 |\n|---|---|---|")
        for key, values in times.items():
            print(f"| {key} | {np.median(values):.1f} | {np.percentile(values, 95):.1f} |")
    finally:
        sim.send_signal(signal.SIGTERM)
        sim.wait(10)


if __name__ == "__main__":
    main()
