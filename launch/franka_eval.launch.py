"""The franka-eval graph (camera -> policy -> bridge) for ``ros2 launch``, built from the same node
specs that ``franka-eval --ros`` starts without the ROS 2 CLI (``vla_trainer.deploy.ros_graph``).

    ros2 launch launch/franka_eval.launch.py checkpoint:=runs/grpo/checkpoints/latest \\
        robot_ip:=172.16.0.2 camera_serial:=123622270136 instruction:="put carrot on plate" \\
        safety_limits_file:=cell_limits.yaml dry_run:=true python:=$HOME/vla-rl/.venv/bin/python

Arguments: ``vla_trainer.deploy.ros_graph.LAUNCH_ARGUMENTS`` (checkpoint, robot_ip, instruction, camera_serial
or playback_file, camera_crop, camera_file, safety_limits_file, dry_run, home_on_start, relative_dynamics_factor,
device, python). Each node runs as
``python -m <module> --ros-args ...``, with ``python`` the interpreter that has the project and rclpy.

``launch`` and ``launch_ros`` are imported inside ``generate_launch_description`` so that this file
imports anywhere (the project's tests check the Nodes it builds with stand-ins for those two
packages, which are not installable from PyPI). The repository root is put on ``sys.path`` so that
``ros2 launch``'s own Python finds ``vla_trainer.deploy.ros_graph`` (standard library only).
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def generate_launch_description():
    from launch import LaunchDescription
    from launch.actions import DeclareLaunchArgument, OpaqueFunction, Shutdown
    from launch.substitutions import LaunchConfiguration
    from launch_ros.actions import Node

    if str(ROOT) not in sys.path:
        sys.path.append(str(ROOT))
    from vla_trainer.deploy.ros_graph import LAUNCH_ARGUMENTS, graph_from_launch_arguments

    def nodes(context, *args, **kwargs):
        values = {name: LaunchConfiguration(name).perform(context) for name in LAUNCH_ARGUMENTS}
        python = values.pop("python")
        # a node that ends ends the graph (as franka-eval --ros does): the bridge then stops the arm,
        # rather than idle beside a dead policy or camera
        return [Node(executable=python, arguments=["-m", spec.module], name=spec.name,
                     parameters=[dict(spec.parameters)], remappings=list(spec.remappings), output="screen",
                     on_exit=Shutdown(reason=f"the {spec.name} node exited"))
                for spec in graph_from_launch_arguments(values)]

    declared = []
    for name, (default, description) in LAUNCH_ARGUMENTS.items():
        if default is None:
            declared.append(DeclareLaunchArgument(name, description=description))
        else:
            declared.append(DeclareLaunchArgument(name, default_value=default, description=description))
    return LaunchDescription([*declared, OpaqueFunction(function=nodes)])
