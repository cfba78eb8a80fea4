"""``franka/PutOnPlate-v0``: the real Franka + RealSense as the twin's env (same options, same
observation and action), built from plain arguments so that ``gym.make`` and ``franka-eval``
share one path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .operator import KeyboardOperator, Operator, ScriptedOperator


def make_franka_vector_env(num_envs: int = 1, *, instruction: str, robot_ip: str | None = None,
                           ros_arm: Any = None, camera_serial: str | None = None,
                           playback_file: str | None = None, image_size: int = 64,
                           camera_crop: tuple[int, int, int, int] | None = None, camera_file: str | Path | None = None,
                           time_limit: int | None = None, safety_limits: Any = None, dry_run: bool = False,
                           operator: str | Operator = "keyboard", relative_dynamics_factor: float = 0.1,
                           connect_timeout_s: float = 3.0, ignore_realtime: bool = False,
                           max_frame_age_ms: float = 200.0, auto_reset: bool = False, **contract_kwargs: Any):
    """Connect the arm and camera and return the env (``ChunkVectorEnv`` of one env; it owns both
    devices and releases them on ``close``).

    Args:
        robot_ip: the robot's control box (FCI), e.g. ``172.16.0.2``: the arm is driven by franky.
        ros_arm: instead of ``robot_ip``, where the robot PC's ROS 2 stack already owns the arm: a
            ``real_robot.ros_arm.RosArmConfig`` or a YAML file of one (``docs/real_robot.md``).
        instruction: the task in words, as in training (``"put carrot on plate"``).
        camera_serial: the RealSense's serial; or ``playback_file``, a ``.db3`` recording.
        image_size, camera_crop, camera_file, time_limit: as in the twin (``PutOnPlateInScene25*``).
        safety_limits: a ``real_robot.safety.SafetyLimits``, a YAML/JSON file of them, or None for
            the conservative defaults. Its home pose is replaced by the twin's rest pose.
        dry_run: log every command, move nothing.
        operator: ``"keyboard"``, ``"scripted"`` (no labels, no waiting) or an ``Operator``.
        relative_dynamics_factor, connect_timeout_s, ignore_realtime: ``FrankyArmConfig`` (with
            ``ros_arm``, the config's own ``relative_dynamics_factor`` and ``connect_timeout_s`` apply).
        max_frame_age_ms: an older camera frame stops the episode (``StaleFrameError``).
        auto_reset: False: each episode starts with an explicit ``reset`` (an operator prompt).

    Raises:
        ValueError: ``num_envs`` is not 1, neither or both of ``robot_ip`` and ``ros_arm``, or a bad
            option (the message names it).
        RobotUnreachableError, DeviceNotFoundError: the arm or camera is not there.
    """
    import dataclasses

    from real_robot.factory import make_arm
    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig
    from real_robot.safety import SafetyLayer, SafetyLimits
    from vla_envs.core import ChunkVectorEnv
    from vla_envs.camera_file import load_camera_file

    from .backend import FrankaBackend
    from .twin import TWIN_REST_JOINT_POSITIONS_RAD

    if num_envs != 1:
        raise ValueError(f"num_envs={num_envs}: a real arm is one env")
    arm = make_arm(robot_ip=robot_ip, ros_arm=ros_arm, relative_dynamics_factor=relative_dynamics_factor,
                   connect_timeout_s=connect_timeout_s, ignore_realtime=ignore_realtime)
    cam_file = load_camera_file(camera_file)
    crop = None if camera_crop is None else cam_file.check_crop(camera_crop)
    undistort = cam_file.undistorter()
    if isinstance(operator, str):
        if operator not in ("keyboard", "scripted"):
            raise ValueError(f"operator={operator!r}; allowed: 'keyboard', 'scripted', or an Operator object")
        operator = KeyboardOperator() if operator == "keyboard" else ScriptedOperator()
    limits = safety_limits if isinstance(safety_limits, SafetyLimits) else (
        SafetyLimits.from_file(safety_limits) if safety_limits is not None else SafetyLimits())
    limits = dataclasses.replace(limits, home_joint_positions_rad=TWIN_REST_JOINT_POSITIONS_RAD,
                                 dry_run=limits.dry_run or dry_run)
    camera = RealSenseCamera(RealSenseCameraConfig(serial=camera_serial or "", playback_file=playback_file,
                                                   width=cam_file.width, height=cam_file.height))
    camera.connect()  # fails in well under a second without the camera, before the arm is touched
    safety = None
    try:  # whatever fails from here (a bad option, Ctrl-C) releases both devices and the watchdog
        arm.connect()
        safety = SafetyLayer(arm, limits)
        backend = FrankaBackend(safety, camera, instruction=instruction, image_size=image_size, camera_crop=crop,
                                camera_hw=(cam_file.height, cam_file.width), time_limit=time_limit or 80,
                                operator=operator, max_frame_age_ms=max_frame_age_ms, undistort=undistort)
        return ChunkVectorEnv(backend, auto_reset=auto_reset, **contract_kwargs)
    except BaseException:
        releases = ([safety.close] if safety is not None else []) + ([arm.disconnect] if arm.is_connected else [])
        for release in (*releases, camera.disconnect):
            try:
                release()
            except Exception:  # noqa: BLE001  the error that led here is the one to report
                pass
        raise
