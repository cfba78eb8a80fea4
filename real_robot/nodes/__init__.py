"""ROS 2 nodes of the real-robot side and the node spec that starts them (``pip install "vla-rl[ros]"``).

    spec.py         NodeSpec (node name, python module, parameters, remappings), its
                    ``python -m module --ros-args ...`` command line, start_nodes / stop_nodes
    common.py       topic names, QoS, message conversions, typed parameters shared by the nodes
    camera_node.py  a RealSenseCamera -> sensor_msgs/Image on camera/color/image_raw
    bridge_node.py  FrankyArm + SafetyLayer: arm state out, action chunks in, one action per period

Importing these modules loads no rclpy, numpy or vendor SDK; each node imports them in ``main()``
(rclpy before pyrealsense2: the other order crashes the camera process at exit). Nothing here imports
``vla_envs`` or ``vla_trainer``: the policy node, which builds the twin's observation, lives in
``vla_trainer.deploy.ros_policy_node``.
"""
