"""Checks on the physical robot and camera, run by hand on the robot PC (never in CI): set
``FRANKA_IP`` (and ``FRANKA_SAFETY_LIMITS``, a limits file for the cell) and / or
``REALSENSE_SERIAL``. They read, and move the arm only by one small step inside the cell's limits
after homing (docs/real_robot.md, "First runs")."""

from __future__ import annotations

import os

import numpy as np
import pytest

FRANKA_IP = os.environ.get("FRANKA_IP")
REALSENSE_SERIAL = os.environ.get("REALSENSE_SERIAL")


@pytest.mark.skipif(not REALSENSE_SERIAL, reason="no physical camera: set REALSENSE_SERIAL to run")
def test_the_realsense_streams_fresh_frames_of_its_configured_size():
    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig

    with RealSenseCamera(RealSenseCameraConfig(serial=REALSENSE_SERIAL)) as camera:
        first = camera.read(timeout_ms=3000)
        second = camera.read(timeout_ms=1000)
    assert first.image.shape == (480, 640, 3) and first.image.dtype == np.uint8
    assert second.frame_number > first.frame_number and second.timestamp_ms > first.timestamp_ms


@pytest.mark.skipif(not (FRANKA_IP and os.environ.get("FRANKA_SAFETY_LIMITS")),
                    reason="no physical arm: set FRANKA_IP and FRANKA_SAFETY_LIMITS (the cell's limits file) to run")
def test_the_arm_homes_and_takes_one_small_step_inside_its_limits():
    from real_robot.franky_arm import FrankyArm, FrankyArmConfig
    from real_robot.safety import SafetyLayer, SafetyLimits
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD

    limits = SafetyLimits.from_file(os.environ["FRANKA_SAFETY_LIMITS"])
    limits = SafetyLimits(**{**vars(limits), "home_joint_positions_rad": TWIN_REST_JOINT_POSITIONS_RAD})
    with FrankyArm(FrankyArmConfig(robot_ip=FRANKA_IP, relative_dynamics_factor=0.05)) as arm, \
            SafetyLayer(arm, limits) as safe:
        safe.home()
        before = safe.observation().tcp_position_m
        sent = safe.send_action(np.array([0.1, 0, 0, 0, 0, 0, -1], np.float32))  # 1 cm along +x
        after = safe.observation().tcp_position_m
    assert np.linalg.norm(after - before - sent.translation_m) < 0.002
