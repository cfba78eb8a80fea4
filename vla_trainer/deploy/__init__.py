"""Running a trained policy on the robot: the policy server (``serve``, ``vla-serve``), ``franka-eval``
(``franka_eval``) and its ROS 2 graph (``ros_graph``, ``ros_policy_node``)."""
