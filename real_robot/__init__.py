"""The real-robot side: small interfaces for the Franka arm and its cameras, the safety layer every
command passes through, and their franky / ROS 2 / pyrealsense2 implementations.

Importing this package loads neither numpy nor a vendor SDK; each implementation imports its SDK when
it is used and names the pip extra if it is missing. Nothing here imports ``vla_envs`` or
``vla_trainer``: the env backend for the real robot adapts these interfaces, not the other way round.

    arm.py          Arm, ArmObservation
    camera.py       Camera, CameraFrame
    safety.py       SafetyLimits, SafetyLayer, limit_step, Watchdog
    twin_action.py  the twin's normalised action -> a Cartesian step (and back)
    franky_arm.py   FrankyArm, FrankyArmConfig (franky-control)
    ros_arm.py      RosArm, RosArmConfig (a robot PC's ROS 2 stack, rclpy)
    factory.py      make_arm: a robot IP (franky) or a RosArmConfig
    realsense.py    RealSenseCamera, RealSenseCameraConfig, write_recording (pyrealsense2)
    transforms.py   rotation conversions (numpy)
    errors.py       the exceptions
"""
