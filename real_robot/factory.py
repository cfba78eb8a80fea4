"""``make_arm``: the one place that turns "which arm" (a robot IP for franky, or a ROS 2 stack's
``RosArmConfig``) into an ``Arm``, for the env backend, franka-eval and the bridge node alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from real_robot.arm import Arm


def make_arm(*, robot_ip: str | None = None, ros_arm: Any = None, relative_dynamics_factor: float = 0.1,
             connect_timeout_s: float = 3.0, ignore_realtime: bool = False) -> Arm:
    """An unconnected arm: franky at ``robot_ip``, or through the robot PC's ROS 2 stack.

    Args:
        robot_ip: the control box's FCI address; the arm is driven by franky (``FrankyArmConfig``).
        ros_arm: instead, a ``RosArmConfig`` or a YAML/JSON file of one (its own speed and timeout apply).
        relative_dynamics_factor, connect_timeout_s, ignore_realtime: ``FrankyArmConfig`` (franky only).

    Raises:
        ValueError: neither or both of ``robot_ip`` and ``ros_arm`` (empty strings count as not given),
            or a bad config value (named).
        FileNotFoundError: the ``ros_arm`` file does not exist.
    """
    robot_ip = robot_ip or None
    ros_arm = ros_arm or None
    if (robot_ip is None) == (ros_arm is None):
        raise ValueError("give the arm as robot_ip (franky) or as ros_arm (a RosArmConfig or its YAML file), exactly "
                         f"one; got robot_ip={robot_ip!r}, ros_arm={ros_arm!r}")
    if robot_ip is not None:
        from real_robot.franky_arm import FrankyArm, FrankyArmConfig

        return FrankyArm(FrankyArmConfig(robot_ip=robot_ip, relative_dynamics_factor=relative_dynamics_factor,
                                         connect_timeout_s=connect_timeout_s, ignore_realtime=ignore_realtime))
    from real_robot.ros_arm import RosArm, RosArmConfig

    if isinstance(ros_arm, (str, Path)):
        ros_arm = RosArmConfig.from_file(ros_arm)
    if not isinstance(ros_arm, RosArmConfig):
        raise ValueError(f"ros_arm={ros_arm!r}: a RosArmConfig or the path of a YAML/JSON file of one")
    return RosArm(ros_arm)
