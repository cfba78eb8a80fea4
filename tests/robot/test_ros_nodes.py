"""The ROS 2 side of the robot bridge with real rclpy (loopback-only DDS, a domain of this module's
own): the franka-eval graph's camera node (playing back a recording), bridge node (on franky-sim) and
policy node (the shipped warm start), started from the node spec as processes, observed over ROS;
the node spec's command line, and the launch file built from the same spec.

``ros2 launch`` (the ``launch`` / ``launch_ros`` packages) cannot be installed from PyPI, so the launch
file is checked with stand-ins for those two packages; the nodes it would start are the ones started
here from the same specs.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import pytest
from shipped_paths import SHIPPED_WARM_START

from real_robot.nodes.spec import NodeSpec, local_ros_env, start_nodes, stop_nodes
from vla_trainer.deploy import ros_graph

ROOT = Path(__file__).resolve().parents[2]
LAUNCH_FILE = ROOT / "launch" / "franka_eval.launch.py"
DOMAIN_ID = 150 + os.getpid() % 80  # a DDS domain of this test process (parallel runs differ)
TWIN_REST_TCP_M = (0.615, 0.0, 0.170)  # franky-sim's FR3 TCP at the twin's rest joints
DISCOVERY_TIMEOUT_S = 20.0

try:
    import rclpy  # noqa: F401  (before pyrealsense2, see real_robot.realsense)
    import rclpy.executors
    import rclpy.signals

    RCLPY_ERROR = None
except ImportError as e:
    RCLPY_ERROR = f"rclpy is not importable ({e}); install the ros extra: bash scripts/setup.sh dev,robot,ros"

needs_rclpy = pytest.mark.skipif(RCLPY_ERROR is not None, reason=RCLPY_ERROR or "")


# ----- the node spec (no ROS needed) ----------------------------------------------------------------

def test_spec_renders_the_command_line_rclpy_reads():
    spec = NodeSpec("franka_bridge", "real_robot.nodes.bridge_node",
                    {"robot_ip": "172.16.0.2", "serial": "123622270136", "dry_run": True, "period": 0.2,
                     "tiny": 1e-05, "n": 3, "joints": [0, 0.5], "crop": [1, 2, 3, 4], "text": "it's: a \"test\""},
                    remappings=(("image", "camera/color/image_raw"),))
    assert spec.argv("py") == [
        "py", "-m", "real_robot.nodes.bridge_node", "--ros-args", "-r", "__node:=franka_bridge",
        "-p", "robot_ip:='172.16.0.2'", "-p", "serial:='123622270136'", "-p", "dry_run:=true", "-p", "period:=0.2",
        "-p", "tiny:=1.0e-05", "-p", "n:=3", "-p", "joints:=[0.0, 0.5]", "-p", "crop:=[1, 2, 3, 4]",
        "-p", "text:='it''s: a \"test\"'", "-r", "image:=camera/color/image_raw"]


@pytest.mark.parametrize("parameters, message", [
    ({"x": None}, "a parameter is a bool, int, float, str"),
    ({"x": []}, "an empty list has no ROS type"),
    ({"x": [1, "a"]}, "share one type"),
    ({"x": float("nan")}, "a finite number"),
    ({"bad name": 1}, "parameter name"),
])
def test_spec_refuses_what_ros_cannot_carry(parameters, message):
    with pytest.raises(ValueError, match=message):
        NodeSpec("node", "pkg.mod", parameters)
    with pytest.raises(ValueError, match="node name"):
        NodeSpec("bad-name", "pkg.mod")
    with pytest.raises(ValueError, match="is not a topic name"):
        NodeSpec("node", "pkg.mod", remappings=(("image", "a b"),))


@needs_rclpy
def test_rclpy_parses_the_rendered_arguments_back_to_the_same_values():
    from rcl_interfaces.msg import ParameterDescriptor

    values = {"serial": "0123", "flag": False, "rate": 20.0, "count": 7, "joints": [0.0, 0.3927, -1.5],
              "crop": [190, 80, 460, 350], "instruction": "put 'the' carrot: on plate"}
    spec = NodeSpec("renamed", "pkg.mod", values, remappings=(("image", "camera/color/image_raw"),))
    context = rclpy.Context()
    rclpy.init(args=["prog", *spec.ros_arguments()], context=context,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    try:
        node = rclpy.create_node("default_name", context=context)
        got = {}
        for name in values:
            node.declare_parameter(name, None, ParameterDescriptor(dynamic_typing=True))
            value = node.get_parameter(name).value
            got[name] = list(value) if isinstance(value, (list, tuple)) or hasattr(value, "tolist") else value
        assert node.get_name() == "renamed"
        assert node.resolve_topic_name("image") == "/camera/color/image_raw"
        assert got == values
        node.destroy_node()
    finally:
        rclpy.shutdown(context=context)


def test_nodes_start_with_ordinary_scheduling_from_a_realtime_thread(tmp_path):
    """A thread that connected franky runs SCHED_FIFO 99 and its children would inherit it; a busy
    node at realtime priority starves the machine. start_nodes gives every node SCHED_OTHER."""
    (tmp_path / "sched_probe.py").write_text("import os, sys\n"
                                             "path = sys.argv[-1].split(':=')[1].strip(\"'\")\n"
                                             "open(path, 'w').write(str(os.sched_getscheduler(0)))\n")
    out = tmp_path / "policy.txt"
    spec = NodeSpec("probe", "sched_probe", {"out": str(out)})
    result = {}

    def start_from_a_realtime_thread():
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
        except PermissionError:
            result["skip"] = True
            return
        result["procs"] = start_nodes([spec], {"PYTHONPATH": str(tmp_path)}, die_with_parent=False)

    thread = threading.Thread(target=start_from_a_realtime_thread)
    thread.start()
    thread.join()
    if result.get("skip"):
        pytest.skip("no permission to set realtime scheduling here")
    (proc,) = result["procs"]
    assert proc.wait(30) == 0
    assert int(out.read_text()) == os.SCHED_OTHER


def test_node_modules_keep_the_dependency_rule_and_import_light():
    for path in (ROOT / "real_robot" / "nodes").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("vla_envs", "vla_trainer"), f"{path.name} imports {name}"
    code = ("import sys, real_robot.nodes.spec, real_robot.nodes.common, real_robot.nodes.camera_node, "
            "real_robot.nodes.bridge_node, vla_trainer.deploy.ros_graph, vla_trainer.deploy.ros_policy_node\n"
            "print(sorted(m for m in ('numpy', 'rclpy', 'franky', 'pyrealsense2', 'torch', 'vla_envs') "
            "if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_the_graph_copies_of_twin_constants_match_the_twin():
    from vla_envs.backends.franka import twin

    assert ros_graph.TWIN_REST_JOINT_POSITIONS_RAD == twin.TWIN_REST_JOINT_POSITIONS_RAD
    assert ros_graph.TWIN_CONTROL_PERIOD_S == twin.CONTROL_PERIOD_S
    assert ros_graph.camera_file_hw(ros_graph.DEFAULT_CAMERA_FILE) == (480, 640)


def test_a_camera_file_the_launch_cannot_read_is_named(tmp_path):
    (tmp_path / "binary.json").write_bytes(bytes(range(128, 256)))
    for name, says in (("", "is a folder"), ("binary.json", "a JSON object with integer"), ("none.json", "does not exist")):
        with pytest.raises(ValueError, match=says):
            ros_graph.camera_file_hw(tmp_path / name)


def test_franka_eval_graph_wires_camera_policy_and_bridge():
    specs = ros_graph.franka_eval_graph(checkpoint=str(SHIPPED_WARM_START), robot_ip="172.16.0.2",
                                        instruction="put carrot on plate", camera_serial="123622270136",
                                        camera_crop=(190, 80, 460, 350), dry_run=True)
    by_name = {s.name: s for s in specs}
    assert [s.name for s in specs] == ["camera", "policy", "franka_bridge"]
    assert by_name["camera"].module == "real_robot.nodes.camera_node"
    assert by_name["camera"].parameters == {"serial": "123622270136", "width": 640, "height": 480, "fps": 30}
    assert by_name["policy"].module == "vla_trainer.deploy.ros_policy_node"
    assert by_name["policy"].remappings == (("image", "camera/color/image_raw"),)
    assert by_name["policy"].parameters["camera_crop"] == [190, 80, 460, 350]
    assert by_name["policy"].parameters["checkpoint"] == str(SHIPPED_WARM_START)
    bridge = by_name["franka_bridge"].parameters
    assert bridge["dry_run"] is True and bridge["robot_ip"] == "172.16.0.2" and bridge["ignore_realtime"] is False
    assert bridge["home_joint_positions_rad"] == list(ros_graph.TWIN_REST_JOINT_POSITIONS_RAD)
    with pytest.raises(ValueError, match="exactly one"):
        ros_graph.franka_eval_graph(checkpoint="c", robot_ip="r", instruction="i")
    with pytest.raises(ValueError, match="camera_crop"):
        ros_graph.franka_eval_graph(checkpoint="c", robot_ip="r", instruction="i", camera_serial="1",
                                    camera_crop=(0, 0, 700, 10))
    with pytest.raises(ValueError, match="dry_run:='maybe': true or false"):
        ros_graph.graph_from_launch_arguments({"checkpoint": "c", "robot_ip": "r", "instruction": "i",
                                               "camera_serial": "1", "dry_run": "maybe"})


def test_with_a_ros_arm_the_graphs_state_topics_leave_the_stacks_names(tmp_path):
    """Beside the robot's ROS 2 stack (``ros_arm_file``) the bridge publishes the arm state under
    ``franka_bridge/`` and the policy reads it there: the stack's ``/joint_states`` is never mixed in."""
    arm_file = tmp_path / "arm.yaml"
    arm_file.write_text("gripper: none\n")
    specs = {s.name: s for s in ros_graph.graph_from_launch_arguments(
        {"checkpoint": "c", "ros_arm_file": str(arm_file), "instruction": "i", "camera_serial": "1"})}
    bridge, policy = specs["franka_bridge"], specs["policy"]
    assert bridge.parameters["ros_arm_file"] == str(arm_file) and "robot_ip" not in bridge.parameters
    moved = (("joint_states", "franka_bridge/joint_states"), ("tcp_pose", "franka_bridge/tcp_pose"))
    assert bridge.remappings == moved and policy.remappings == (("image", "camera/color/image_raw"), *moved)
    for both in ({"robot_ip": "r", "ros_arm_file": str(arm_file)}, {}):
        with pytest.raises(ValueError, match="exactly one"):
            ros_graph.graph_from_launch_arguments({"checkpoint": "c", "instruction": "i", "camera_serial": "1", **both})


@needs_rclpy
def test_the_bridge_refuses_to_publish_state_on_the_stacks_topics():
    from real_robot.nodes.bridge_node import _state_topic_clash
    from real_robot.ros_arm import RosArm, RosArmConfig

    arm = RosArm(RosArmConfig(gripper="none", error_recovery_action=""))
    for args, clash in ((["--ros-args"], True), (["--ros-args", "-r", "joint_states:=franka_bridge/joint_states",
                                                  "-r", "tcp_pose:=franka_bridge/tcp_pose"], False)):
        context = rclpy.Context()
        rclpy.init(args=args, context=context, domain_id=DOMAIN_ID,
                   signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
        node = rclpy.create_node("franka_bridge", context=context)
        try:
            message = _state_topic_clash(node, arm)
            assert bool(message) == clash, message
            if clash:
                assert "/joint_states" in message and "-r joint_states:=franka_bridge/joint_states" in message
        finally:
            node.destroy_node()
            rclpy.shutdown(context=context)


def test_the_bridge_refuses_a_control_period_the_watchdog_would_cut():
    from real_robot.franky_arm import FrankyArm, FrankyArmConfig
    from real_robot.nodes.bridge_node import Bridge
    from real_robot.safety import SafetyLayer, SafetyLimits

    with SafetyLayer(FrankyArm(FrankyArmConfig(robot_ip="172.16.0.2")), SafetyLimits(watchdog_timeout_s=1.0)) as safety:
        with pytest.raises(ValueError, match="control_period_s=1.5 must be below.*watchdog_timeout_s=1.0"):
            Bridge(None, safety, control_period_s=1.5, state_rate_hz=30.0, base_frame="base")


@needs_rclpy
def test_a_camera_node_that_cannot_reopen_its_recording_ends_rather_than_idle(tmp_path):
    from real_robot.nodes.camera_node import CameraPublisher
    from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig, write_recording

    recording = write_recording(tmp_path / "short.db3", [np.full((48, 64, 3), i, np.uint8) for i in range(5)], fps=15)
    context = rclpy.Context()
    rclpy.init(args=["--ros-args"], context=context, domain_id=DOMAIN_ID,
               signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("camera", context=context)
    camera = RealSenseCamera(RealSenseCameraConfig(playback_file=str(recording), width=64, height=48))
    camera.connect()
    recording.unlink()  # gone when the recording ends and is played again
    publisher = CameraPublisher(node, camera, "camera_color_optical_frame", loop_playback=True)
    try:
        publisher.start()
        publisher._thread.join(20.0)
        assert not publisher._thread.is_alive() and publisher.published >= 1
        assert not context.ok()  # the node ends: the graph sees the process go, not a silent camera
    finally:
        if camera.is_connected:
            camera.disconnect()
        node.destroy_node()
        rclpy.try_shutdown(context=context)


# ----- the launch file --------------------------------------------------------------------------------

def load_launch_file():
    spec = importlib.util.spec_from_file_location("franka_eval_launch", LAUNCH_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_launch_file_imports_without_launch_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "launch", None)  # what an absent package looks like to import
    module = load_launch_file()
    with pytest.raises(ImportError):
        module.generate_launch_description()


def fake_launch_packages():
    """Stand-ins for ``launch`` and ``launch_ros`` (not installable here) that record what the launch
    file builds, with the real packages' names and call signatures."""
    def record(kind):
        def __init__(self, *args, **kwargs):
            self.args, self.kwargs = args, kwargs
        return type(kind, (), {"__init__": __init__})

    class LaunchConfiguration:
        def __init__(self, name):
            self.name = name

        def perform(self, context):
            return context.launch_configurations[self.name]

    launch = types.ModuleType("launch")
    launch.LaunchDescription = type("LaunchDescription", (), {"__init__": lambda self, entities: setattr(
        self, "entities", list(entities))})
    launch.actions = types.ModuleType("launch.actions")
    launch.actions.DeclareLaunchArgument = record("DeclareLaunchArgument")
    launch.actions.Shutdown = record("Shutdown")
    launch.actions.OpaqueFunction = type("OpaqueFunction", (), {"__init__": lambda self, *, function: setattr(
        self, "function", function)})
    launch.substitutions = types.ModuleType("launch.substitutions")
    launch.substitutions.LaunchConfiguration = LaunchConfiguration
    launch_ros = types.ModuleType("launch_ros")
    launch_ros.actions = types.ModuleType("launch_ros.actions")
    launch_ros.actions.Node = record("Node")
    return {"launch": launch, "launch.actions": launch.actions, "launch.substitutions": launch.substitutions,
            "launch_ros": launch_ros, "launch_ros.actions": launch_ros.actions}


def test_launch_file_builds_one_node_per_spec_entry(monkeypatch, tmp_path):
    for name, module in fake_launch_packages().items():
        monkeypatch.setitem(sys.modules, name, module)
    description = load_launch_file().generate_launch_description()
    declared = {e.args[0]: e.kwargs for e in description.entities if type(e).__name__ == "DeclareLaunchArgument"}
    assert {"checkpoint", "robot_ip", "camera_serial", "instruction", "camera_crop", "dry_run"} <= set(declared)
    assert "default_value" not in declared["checkpoint"] and declared["dry_run"]["default_value"] == "false"
    (opaque,) = [e for e in description.entities if type(e).__name__ == "OpaqueFunction"]

    values = {name: kwargs.get("default_value", "") for name, kwargs in declared.items()}
    values.update(checkpoint=str(SHIPPED_WARM_START), robot_ip="172.16.0.2", camera_serial="123622270136",
                  instruction="put carrot on plate", camera_crop="190,80,460,350", dry_run="true",
                  python="/opt/venv/bin/python")
    nodes = opaque.function(types.SimpleNamespace(launch_configurations=values))
    specs = ros_graph.graph_from_launch_arguments({k: v for k, v in values.items() if k != "python"})
    assert len(nodes) == len(specs) == 3
    for node, spec in zip(nodes, specs):
        assert node.kwargs["executable"] == "/opt/venv/bin/python"
        assert node.kwargs["arguments"] == ["-m", spec.module]
        assert node.kwargs["name"] == spec.name
        assert node.kwargs["parameters"] == [spec.parameters]
        assert node.kwargs["remappings"] == list(spec.remappings)
        assert type(node.kwargs["on_exit"]).__name__ == "Shutdown"  # one node's end ends the graph
    policy, bridge = nodes[1].kwargs, nodes[2].kwargs
    assert policy["parameters"][0]["camera_crop"] == [190, 80, 460, 350]
    assert policy["remappings"] == [("image", "camera/color/image_raw")]
    assert bridge["parameters"][0]["dry_run"] is True and bridge["parameters"][0]["robot_ip"] == "172.16.0.2"


def test_franka_eval_ros_uses_the_inherited_domain_and_finds_a_ros_arm_stack_on_another_host():
    """--ros moved every node to domain 0 with localhost-only discovery: a --ros-arm bridge never
    found the robot PC's stack, which ros2 launch (inheriting ROS_DOMAIN_ID) found."""
    from vla_trainer.deploy.franka_eval import parse_args

    assert local_ros_env(None) == {"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"}  # ROS_DOMAIN_ID inherited
    assert local_ros_env(7, localhost=False) == {"ROS_DOMAIN_ID": "7"}
    with pytest.raises(ValueError, match=r"domain_id=300: an integer in \[0, 232\]"):
        local_ros_env(300)
    args = parse_args(["--checkpoint", "ckpt", "--ros-arm", "arm.yaml", "--camera-serial", "1", "--instruction", "x",
                       "--ros"])
    assert args.ros_domain_id is None and args.device == "cpu"


def test_ros2_launch_and_franka_eval_ros_give_the_nodes_the_same_parameters():
    """The launched graph started acting from wherever the arm was (home_on_start false there, true in
    franka-eval --ros): one command line, two graphs."""
    from vla_trainer.deploy.franka_eval import parse_args, ros_specs

    given = dict(checkpoint="ckpt", robot_ip="172.16.0.2", instruction="put carrot on plate",
                 camera_serial="123622270136")
    launched = ros_graph.graph_from_launch_arguments(given)
    args = parse_args(["--checkpoint", "ckpt", "--robot-ip", "172.16.0.2", "--camera-serial", "123622270136",
                       "--instruction", "put carrot on plate", "--ros"])
    started = ros_specs(args, None)
    assert [s.name for s in launched] == [s.name for s in started]
    for a, b in zip(launched, started):
        assert (a.parameters, a.remappings) == (b.parameters, b.remappings), a.name
    with pytest.raises(ValueError, match="relative_dynamics_factor:='2': a number in"):
        ros_graph.graph_from_launch_arguments({**given, "relative_dynamics_factor": "2"})


# ----- the nodes over ROS 2 ----------------------------------------------------------------------------

class Observer:
    """An rclpy node in this process (own context, no signal handlers) that records what the graph
    publishes, spun in a thread."""

    def __init__(self):
        from geometry_msgs.msg import PoseStamped
        from sensor_msgs.msg import Image, JointState
        from std_msgs.msg import Float32MultiArray, Header

        from real_robot.nodes import common

        self.context = rclpy.Context()
        rclpy.init(context=self.context, domain_id=DOMAIN_ID,
                   signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
        self.node = rclpy.create_node("test_observer", context=self.context)
        self.lock = threading.Lock()
        self.wall_s: dict[int, float] = {}
        self.messages: dict[str, list] = {k: [] for k in ("image", "joints", "pose", "sent", "ready", "chunk")}
        for key, msg_type, topic, qos in [
                ("image", Image, common.IMAGE_TOPIC, common.image_subscriber_qos()),
                ("joints", JointState, common.JOINT_STATES_TOPIC, 10), ("pose", PoseStamped, common.TCP_POSE_TOPIC, 10),
                ("sent", Float32MultiArray, common.ACTION_SENT_TOPIC, 10), ("ready", Header, common.READY_TOPIC, 10),
                ("chunk", Float32MultiArray, common.ACTION_CHUNK_TOPIC, 10)]:
            self.node.create_subscription(msg_type, topic, self._recorder(key), qos)
        self.chunk_pub = self.node.create_publisher(Float32MultiArray, common.ACTION_CHUNK_TOPIC, 10)
        self.executor = rclpy.executors.SingleThreadedExecutor(context=self.context)
        self.executor.add_node(self.node)
        self.thread = threading.Thread(target=self.executor.spin, daemon=True)
        self.thread.start()

    def _recorder(self, key):
        def record(msg):
            with self.lock:
                self.messages[key].append((time.monotonic(), msg))
                self.wall_s[id(msg)] = time.time()  # the clock of ROS header stamps
        return record

    def received(self, key, since_s=0.0):
        with self.lock:
            return [(t, m) for t, m in self.messages[key] if t >= since_s]

    def publish_chunk(self, actions):
        from real_robot.nodes.common import CHUNK_LABELS, array_msg

        self.chunk_pub.publish(array_msg(np.asarray(actions, np.float32), CHUNK_LABELS))

    def call(self, service, timeout_s=30.0):
        from std_srvs.srv import Trigger

        client = self.node.create_client(Trigger, service)
        try:
            assert client.wait_for_service(timeout_sec=DISCOVERY_TIMEOUT_S), f"no service {service}"
            future = client.call_async(Trigger.Request())
            wait_until(future.done, timeout_s, f"{service} to answer")
            return future.result()
        finally:
            self.node.destroy_client(client)

    def tcp_position(self):
        _, msg = self.received("pose")[-1]
        p = msg.pose.position
        return np.array([p.x, p.y, p.z])

    def settled_tcp_position(self, timeout_s=5.0):
        """The TCP once two readings 0.15 s apart agree within 0.2 mm (franky-sim's arm lags)."""
        deadline_s = time.monotonic() + timeout_s
        previous = self.tcp_position()
        while True:
            time.sleep(0.15)
            now = self.tcp_position()
            if np.linalg.norm(now - previous) < 2e-4:
                return now
            assert time.monotonic() < deadline_s, f"the arm still moves after {timeout_s} s"
            previous = now

    def close(self):
        self.executor.shutdown()
        self.node.destroy_node()
        rclpy.shutdown(context=self.context)
        self.thread.join(5.0)


def wait_until(predicate, timeout_s, what):
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def ros_env():
    if RCLPY_ERROR is not None:
        pytest.skip(RCLPY_ERROR)
    env = local_ros_env(DOMAIN_ID)
    with pytest.MonkeyPatch.context() as mp:
        for key, value in env.items():
            mp.setenv(key, value)
        yield env


@pytest.fixture(scope="module")
def recording(ros_env, tmp_path_factory):
    from real_robot.realsense import write_recording

    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (480, 640, 3), dtype=np.uint8) for _ in range(6)]
    path = write_recording(tmp_path_factory.mktemp("ros") / "scene.db3", images, fps=10)
    return path, images


@pytest.fixture(scope="module")
def graph(ros_env, recording, franky_sim, tmp_path_factory):
    """Camera and bridge nodes of the franka-eval graph (the policy node is added by its test)."""
    # franky_sim's readiness check connected franky from this thread, which made it SCHED_FIFO 99
    # (libfranka does that): give it back ordinary scheduling before starting anything from it
    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
    folder = tmp_path_factory.mktemp("ros-graph")
    x, y, z = TWIN_REST_TCP_M
    limits = folder / "limits.yaml"  # a 6 cm box around the twin's rest pose
    limits.write_text(f"workspace_min_m: [{x - 0.06}, {y - 0.06}, {z - 0.06}]\n"
                      f"workspace_max_m: [{x + 0.06}, {y + 0.06}, {z + 0.06}]\n"
                      "max_relative_dynamics_factor: 0.5\nwatchdog_timeout_s: 5.0\n")
    specs = {s.name: s for s in ros_graph.franka_eval_graph(
        checkpoint=str(SHIPPED_WARM_START), robot_ip=franky_sim, instruction="put carrot on plate",
        playback_file=str(recording[0]), safety_limits_file=str(limits), ignore_realtime=True,
        relative_dynamics_factor=0.5, home_on_start=True)}
    logs = folder / "logs"
    procs = dict(zip(["camera", "franka_bridge"],
                     start_nodes([specs["camera"], specs["franka_bridge"]], ros_env, log_dir=logs)))
    observer = Observer()
    state = types.SimpleNamespace(specs=specs, procs=procs, logs=logs, observer=observer, started_s=time.monotonic())
    try:
        yield state
    finally:
        observer.close()
        stop_nodes(procs.values())


def log_text(graph, name):
    return (graph.logs / f"{name}.log").read_text(errors="replace")


def test_graph_has_the_nodes_topics_and_types_and_data_flows(graph, recording):
    obs = graph.observer
    expected_topics = {"/camera/color/image_raw": ["sensor_msgs/msg/Image"],
                       "/joint_states": ["sensor_msgs/msg/JointState"],
                       "/tcp_pose": ["geometry_msgs/msg/PoseStamped"],
                       "/action_sent": ["std_msgs/msg/Float32MultiArray"],
                       "/ready": ["std_msgs/msg/Header"]}

    bridge_topics = ("/joint_states", "/tcp_pose", "/action_sent", "/ready")

    def graph_seen():  # what this process knows of the graph now (discovery takes seconds)
        node = obs.node
        names = set(node.get_node_names())
        seen = {"nodes": {"camera", "franka_bridge"} & names, "topics": dict(node.get_topic_names_and_types())}
        if {"camera", "franka_bridge"} <= names:
            seen["bridge publishes"] = dict(node.get_publisher_names_and_types_by_node("franka_bridge", "/"))
            seen["bridge subscribes"] = dict(node.get_subscriber_names_and_types_by_node("franka_bridge", "/"))
            seen["bridge services"] = dict(node.get_service_names_and_types_by_node("franka_bridge", "/"))
            seen["camera publishes"] = dict(node.get_publisher_names_and_types_by_node("camera", "/"))
        return seen

    def graph_complete(seen):
        return (seen["nodes"] == {"camera", "franka_bridge"}
                and all(seen["topics"].get(t) == v for t, v in expected_topics.items())
                and all(seen["bridge publishes"].get(t) == expected_topics[t] for t in bridge_topics)
                and seen["bridge subscribes"].get("/action_chunk") == ["std_msgs/msg/Float32MultiArray"]
                and all(seen["bridge services"].get(f"/franka_bridge/{s}") == ["std_srvs/srv/Trigger"]
                        for s in ("home", "stop", "resume"))
                and seen["camera publishes"].get("/camera/color/image_raw") == ["sensor_msgs/msg/Image"])

    for name, proc in graph.procs.items():
        assert proc.poll() is None, f"{name} exited:\n{log_text(graph, name)}"
    deadline_s = time.monotonic() + DISCOVERY_TIMEOUT_S
    while not graph_complete(seen := graph_seen()):
        assert time.monotonic() < deadline_s, f"the graph is incomplete after {DISCOVERY_TIMEOUT_S} s: {seen}"
        time.sleep(0.1)

    # images: the recorded frames, rgb8, stamped with the recording's timestamps
    wait_until(lambda: len(obs.received("image")) >= 3, 10.0, "three images")
    _, image = obs.received("image")[-1]
    assert (image.width, image.height, image.encoding, image.step) == (640, 480, "rgb8", 640 * 3)
    pixels = np.frombuffer(image.data, np.uint8).reshape(480, 640, 3)
    assert any(np.array_equal(pixels, recorded) for recorded in recording[1])
    stamp_ms = image.header.stamp.sec * 1e3 + image.header.stamp.nanosec * 1e-6
    assert 1000.0 <= stamp_ms < 1000.0 + 100.0 * len(recording[1]) + 1.0  # write_recording's timestamps

    # the arm state at >= 10 Hz, joints and pose paired by stamp
    since = time.monotonic()
    time.sleep(1.0)
    joints, poses = obs.received("joints", since), obs.received("pose", since)
    assert len(joints) >= 10 and len(poses) >= 10
    _, js = joints[-1]
    assert list(js.name) == [f"fr3_joint{i}" for i in range(1, 8)] + ["gripper_width"]
    assert len(js.position) == 8 and 0.0 <= js.position[7] <= 0.081
    np.testing.assert_allclose(js.position[:7], ros_graph.TWIN_REST_JOINT_POSITIONS_RAD, atol=0.05)  # homed at start
    pose_stamps = {(m.header.stamp.sec, m.header.stamp.nanosec) for _, m in obs.received("pose")}
    assert (js.header.stamp.sec, js.header.stamp.nanosec) in pose_stamps
    assert poses[-1][1].header.frame_id == "base" and js.header.frame_id == "base"
    np.testing.assert_allclose(obs.tcp_position(), TWIN_REST_TCP_M, atol=0.005)
    # from the bridge's reading to this process (one clock on both ends): a few milliseconds
    latency_s = [obs.wall_s[id(m)] - (m.header.stamp.sec + m.header.stamp.nanosec * 1e-9) for _, m in joints]
    assert 0.0 <= float(np.median(latency_s)) < 0.1, latency_s


def test_an_action_chunk_moves_franky_sim_and_a_nan_chunk_moves_nothing(graph):
    obs = graph.observer
    wait_until(lambda: obs.chunk_pub.get_subscription_count() > 0, DISCOVERY_TIMEOUT_S, "the bridge's subscription")
    reply = obs.call("/franka_bridge/home")
    assert reply.success, reply.message
    start = obs.settled_tcp_position()
    np.testing.assert_allclose(start, TWIN_REST_TCP_M, atol=0.005)

    # two actions of +0.2 x: 0.1 m per unit = 2 cm each (the default per-step cap), 4 cm in a 6 cm box
    published_s = time.monotonic()
    obs.publish_chunk([[0.2, 0, 0, 0, 0, 0, -1]] * 2)
    wait_until(lambda: len(obs.received("sent", published_s)) >= 2 and obs.received("ready", published_s)
               and obs.received("ready", published_s)[-1][0] > obs.received("sent", published_s)[-1][0],
               10.0, "two actions sent and the bridge ready")
    sent = obs.received("sent", published_s)
    assert len(sent) == 2
    for _, msg in sent:
        np.testing.assert_allclose(msg.data, [0.2, 0, 0, 0, 0, 0, -1], atol=1e-6)
        assert [(d.label, d.size) for d in msg.layout.dim] == [("action", 7)]
    assert sent[1][0] - sent[0][0] >= 0.2 - 0.02  # one action per control period
    moved = obs.settled_tcp_position() - start
    np.testing.assert_allclose(moved, [0.04, 0.0, 0.0], atol=0.003)

    # NaN in a chunk: the safety layer stops the arm, the chunk is dropped, nothing is sent
    before = obs.settled_tcp_position()
    published_s = time.monotonic()
    obs.publish_chunk([[0.2, 0, 0, 0, 0, 0, -1], [np.nan, 0, 0, 0, 0, 0, -1]])
    wait_until(lambda: obs.received("ready", published_s), 5.0, "the bridge ready after dropping the chunk")
    time.sleep(1.0)
    assert obs.received("sent", published_s) == []
    assert np.linalg.norm(obs.settled_tcp_position() - before) < 0.001
    log = log_text(graph, "franka_bridge")
    assert "dropped an action chunk with non-finite values in rows [1]" in log
    assert "non_finite limited a command" in log  # the safety layer saw it (and stopped the arm)


def test_stop_service_holds_chunks_until_resume(graph):
    obs = graph.observer
    wait_until(lambda: obs.chunk_pub.get_subscription_count() > 0, DISCOVERY_TIMEOUT_S, "the bridge's subscription")
    assert obs.call("/franka_bridge/stop").success
    held_s = time.monotonic()
    obs.publish_chunk([[0.0, 0, 0, 0, 0, 0, -1]])
    time.sleep(1.0)
    assert obs.received("sent", held_s) == []
    assert obs.call("/franka_bridge/resume").success
    resumed_s = time.monotonic()
    obs.publish_chunk([[0.0, 0, 0, 0, 0, 0, -1]])
    wait_until(lambda: obs.received("sent", resumed_s), 5.0, "the action sent after ~/resume")


def test_policy_node_publishes_paced_twin_scaled_chunks(graph, ros_env):
    from vla_envs.backends.franka.twin import TWIN_TRACKING_GAIN

    obs = graph.observer
    start_s = time.monotonic()
    (proc,) = start_nodes([graph.specs["policy"]], ros_env, log_dir=graph.logs)
    graph.procs["policy"] = proc
    wait_until(lambda: len(obs.received("chunk", start_s)) >= 2 or proc.poll() is not None, 60.0,
               "two chunks from the policy node")
    assert proc.poll() is None, log_text(graph, "policy")
    chunks = obs.received("chunk", start_s)
    first_s = chunks[0][0]
    for _, msg in chunks:
        assert [(d.label, d.size) for d in msg.layout.dim] == [("chunk", 8), ("action", 7)]
        actions = np.asarray(msg.data, dtype=np.float64).reshape(8, 7)
        assert np.isfinite(actions).all() and np.abs(actions).max() <= 1.0
        # converted with twin_scaled_action: translation and rotation scaled by the tracking gains
        assert np.all(np.abs(actions[:, :3]) <= np.asarray(TWIN_TRACKING_GAIN[:3]) + 1e-6)
        assert np.all(np.linalg.norm(actions[:, 3:6], axis=1) <= TWIN_TRACKING_GAIN[3] + 1e-6)
    # paced by the bridge: the next chunk only after the 8 actions of the previous one ran (0.2 s each)
    sent_between = [t for t, _ in obs.received("sent", first_s) if t < chunks[1][0]]
    assert chunks[1][0] - first_s >= 8 * 0.2 - 0.05
    assert len(sent_between) == 8, f"{len(sent_between)} actions ran between the first two chunks"
    # the arm stayed in the safety box
    x, y, z = TWIN_REST_TCP_M
    assert np.all(np.abs(obs.tcp_position() - [x, y, z]) <= 0.06 + 0.003)
    assert "loaded" in log_text(graph, "policy")


def _libero_labelled_warm_start(folder: Path) -> Path:
    """The shipped warm start, recorded as trained on LIBERO (its actions: robosuite's)."""
    import json

    folder.mkdir()
    for f in SHIPPED_WARM_START.iterdir():
        (folder / f.name).symlink_to(f)
    made_by = json.loads((SHIPPED_WARM_START / "made_by.json").read_text())
    made_by["demos"]["env_id"] = "libero_spatial"
    (folder / "made_by.json").unlink()
    (folder / "made_by.json").write_text(json.dumps(made_by))
    return folder


@pytest.mark.parametrize("case", ["camera of another resolution", "libero checkpoint", "another crop"])
@pytest.mark.reliability(fault="ros2 launch with a checkpoint that does not fit the robot env", cases=1,
                         outcome="the policy node exits 2 naming both sides, before any chunk")
def test_a_policy_node_refuses_a_checkpoint_that_does_not_fit_as_franka_eval_does(ros_env, tmp_path, case):
    """Under ros2 launch the policy node is all that checks: it acted with a LIBERO checkpoint's actions
    and on a crop other than the trained one (franka-eval refused both). It ends (exit 2) before any
    chunk, naming both sides. The shipped warm start's crop counts pixels of 640x480 frames: on a
    1280x720 camera file the same numbers cut another view."""
    from calibration.camera_file import write_camera_file
    from calibration.synthetic import default_intrinsics, look_at

    kwargs, expected = {}, ()
    checkpoint = SHIPPED_WARM_START
    if case == "camera of another resolution":
        kwargs["camera_file"] = str(write_camera_file(tmp_path / "camera.json", intrinsics=default_intrinsics(1280, 720),
                                                      T_base_from_cam=look_at([1.0, -0.4, 0.6], [0.45, 0.0, 0.1])))
        expected = ("640x480", "1280x720")
    elif case == "libero checkpoint":
        checkpoint = _libero_labelled_warm_start(tmp_path / "libero")
        expected = ("trained on libero_spatial", "LIBERO's")
    else:
        kwargs["camera_crop"] = (0, 0, 640, 480)
        expected = ("(190, 80, 460, 350)", "(0, 0, 640, 480)")
    specs = {s.name: s for s in ros_graph.franka_eval_graph(
        checkpoint=str(checkpoint), robot_ip="127.0.0.1", instruction="put carrot on plate",
        playback_file=str(tmp_path / "unused.db3"), **kwargs)}
    (proc,) = start_nodes([specs["policy"]], ros_env, log_dir=tmp_path)
    try:
        assert proc.wait(timeout=60) == 2
    finally:
        stop_nodes([proc])
    log = (tmp_path / "policy.log").read_text(errors="replace")
    assert all(e in log for e in expected), log


@pytest.mark.reliability(fault="the arm executes a chunk slower than its nominal duration (slow dynamics)", cases=1,
                         outcome="the policy node waits while the bridge reports progress; no chunk is cut")
def test_a_slow_chunk_is_never_cut_by_the_ready_timeout(ros_env):
    """At a slow relative dynamics a chunk of 8 actions takes 5-6 s on franky-sim; the node acted
    anyway 8 x 0.2 + 2 s after publishing it, and its new chunk replaced the 3-5 actions still to
    run. Now each action_sent (the bridge executing) pushes the deadline on: no chunk while the
    bridge reports progress, and one ready_timeout_s after it falls silent."""
    from geometry_msgs.msg import PoseStamped
    from sensor_msgs.msg import Image, JointState
    from std_msgs.msg import Float32MultiArray, Header

    from real_robot.nodes import common
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD
    from vla_trainer.deploy.ros_policy_node import PolicyNode
    from vla_trainer.deploy.serve import PolicyService

    policy = PolicyService(SHIPPED_WARM_START)
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    # a namespace of its own: the module's graph (a policy node among them) may still be publishing
    node = rclpy.create_node("policy_under_test", namespace="/slow_chunk_test", context=context)
    feed = rclpy.create_node("feed", namespace="/slow_chunk_test", context=context)
    chunks: list[float] = []
    feed.create_subscription(Float32MultiArray, common.ACTION_CHUNK_TOPIC, lambda m: chunks.append(time.monotonic()), 10)
    image_pub = feed.create_publisher(Image, "image", common.image_publisher_qos())
    joints_pub = feed.create_publisher(JointState, common.JOINT_STATES_TOPIC, 10)
    pose_pub = feed.create_publisher(PoseStamped, common.TCP_POSE_TOPIC, 10)
    ready_pub = feed.create_publisher(Header, common.READY_TOPIC, common.ready_qos())
    sent_pub = feed.create_publisher(Float32MultiArray, common.ACTION_SENT_TOPIC, 10)
    frame = np.random.default_rng(0).integers(0, 256, (480, 640, 3), dtype=np.uint8)
    pose = np.eye(4)
    pose[:3, :3] = np.diag([1.0, -1.0, -1.0])
    pose[:3, 3] = TWIN_REST_TCP_M

    def publish_observation():
        stamp = common.stamp_from_seconds(time.time())
        image_pub.publish(common.image_msg(frame, stamp, "camera"))
        joints = JointState(name=list(common.JOINT_STATE_NAMES), position=[*TWIN_REST_JOINT_POSITIONS_RAD, 0.08])
        joints.header.stamp = stamp
        joints_pub.publish(joints)
        tcp = PoseStamped(pose=common.pose_from_matrix(pose))
        tcp.header.stamp, tcp.header.frame_id = stamp, "base"
        pose_pub.publish(tcp)

    PolicyNode(node, policy, instruction="put carrot on plate", camera_crop=policy.spec.camera_crop,
               camera_hw=(480, 640), control_period_s=0.2, ready_timeout_s=1.5, max_image_age_s=1.0)
    executor = rclpy.executors.MultiThreadedExecutor(context=context)
    executor.add_node(node)
    executor.add_node(feed)
    thread = threading.Thread(target=executor.spin, daemon=True)
    thread.start()
    try:
        ready_pub.publish(Header(stamp=common.stamp_from_seconds(time.time())))
        deadline_s = time.monotonic() + DISCOVERY_TIMEOUT_S
        while not chunks:
            assert time.monotonic() < deadline_s, "no first chunk"
            publish_observation()
            time.sleep(0.1)
        first_s = chunks[0]
        # the bridge executes slowly: an action every 0.4 s for 4.5 s, past 8 x 0.2 + 1.5 = 3.1 s
        while time.monotonic() < first_s + 4.5:
            sent_pub.publish(common.array_msg(np.zeros(7, np.float32), ("action",)))
            publish_observation()
            time.sleep(0.4)
        assert len(chunks) == 1, f"a chunk {chunks[1] - first_s:.2f} s after the first cut into it"
        silent_s = time.monotonic()
        while len(chunks) < 2 and time.monotonic() < silent_s + 8.0:
            publish_observation()
            time.sleep(0.1)
        assert len(chunks) == 2, "no chunk after the bridge fell silent"
        assert 1.0 < chunks[1] - silent_s < 5.0, chunks[1] - silent_s  # ready_timeout_s after the last action_sent
    finally:
        executor.shutdown()
        node.destroy_node()
        feed.destroy_node()
        rclpy.shutdown(context=context)
        thread.join(5.0)


def test_sigterm_stops_every_node_process(graph):
    obs = graph.observer  # both nodes up (run alone, this test would otherwise signal them mid-start)
    wait_until(lambda: obs.received("ready") and obs.received("image"), 60.0, "the bridge and the camera to publish")
    procs = dict(graph.procs)
    for name, proc in procs.items():
        assert proc.poll() is None, f"{name} exited early:\n{log_text(graph, name)}"
    start_s = time.monotonic()
    codes = stop_nodes(procs.values(), timeout_s=10.0)
    elapsed_s = time.monotonic() - start_s
    assert codes == [0] * len(procs), {name: log_text(graph, name)[-2000:] for name in procs}
    assert elapsed_s < 5.0
    for proc in procs.values():
        with pytest.raises(ProcessLookupError):
            os.kill(proc.pid, 0)
    assert "stopped FrankyArm(" in log_text(graph, "franka_bridge")


@needs_rclpy
@pytest.mark.slow
def test_stop_cuts_homing_and_a_chunk_sent_while_homing_is_never_run(franky_sim):
    """The bridge in this process over franky-sim, homing slowly (5 % dynamics) to the twin's rest pose:
    ``~/stop`` answers at once and the arm stops short of home (it waited for homing to end before:
    one callback group held both services); a chunk that arrives while homing (planned from an arm on
    its way) is dropped, not run once homing ends."""
    from franky_sim_server import connected_layer
    from std_msgs.msg import Float32MultiArray
    from std_srvs.srv import Trigger

    from real_robot.nodes.bridge_node import EXECUTOR_THREADS, Bridge
    from std_msgs.msg import Header

    from real_robot.nodes.common import (ACTION_CHUNK_TOPIC, ACTION_SENT_TOPIC, CHUNK_LABELS, READY_TOPIC, array_msg,
                                         ready_qos)
    from vla_envs.backends.franka.twin import TWIN_REST_JOINT_POSITIONS_RAD

    os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # not the realtime priority franky left here
    context = rclpy.Context()
    rclpy.init(context=context, domain_id=DOMAIN_ID, signal_handler_options=rclpy.signals.SignalHandlerOptions.NO)
    node = rclpy.create_node("franka_bridge", namespace="/homing_test", context=context)
    caller = rclpy.create_node("caller", namespace="/homing_test", context=context)
    sent: list[float] = []
    ready: list[float] = []
    caller.create_subscription(Float32MultiArray, ACTION_SENT_TOPIC, lambda msg: sent.append(time.monotonic()), 10)
    caller.create_subscription(Header, READY_TOPIC, lambda msg: ready.append(time.monotonic()), ready_qos())
    chunks = caller.create_publisher(Float32MultiArray, ACTION_CHUNK_TOPIC, 10)
    executor = rclpy.executors.MultiThreadedExecutor(num_threads=EXECUTOR_THREADS + 1, context=context)
    executor.add_node(caller)

    def call(name):
        client = caller.create_client(Trigger, f"/homing_test/franka_bridge/{name}")
        assert client.wait_for_service(timeout_sec=DISCOVERY_TIMEOUT_S)
        return client.call_async(Trigger.Request())

    with connected_layer(franky_sim, {"relative_dynamics_factor": 0.05},
                         home_joint_positions_rad=TWIN_REST_JOINT_POSITIONS_RAD) as layer:
        bridge = Bridge(node, layer, control_period_s=0.2, state_rate_hz=20.0, base_frame="base")
        executor.add_node(node)
        spinner = threading.Thread(target=executor.spin, daemon=True)
        spinner.start()
        try:
            far_rad = np.abs(layer.observation().joint_positions_rad - TWIN_REST_JOINT_POSITIONS_RAD).max()
            assert far_rad > 0.3  # homing takes seconds from here
            homing = call("home")
            time.sleep(1.0)
            asked_s = time.monotonic()
            stopping = call("stop")
            wait_until(stopping.done, 10.0, "~/stop to answer")
            assert time.monotonic() - asked_s < 1.5 and not homing.done() or not homing.result().success
            wait_until(homing.done, 10.0, "~/home to answer")
            assert not homing.result().success  # cut by the stop
            time.sleep(0.5)
            left_rad = np.abs(layer.observation().joint_positions_rad - TWIN_REST_JOINT_POSITIONS_RAD).max()
            assert left_rad > 0.05, left_rad  # stopped short of home
            wait_until(call("resume").done, 10.0, "~/resume to answer")

            homing = call("home")
            time.sleep(0.5)
            wait_until(lambda: chunks.get_subscription_count() > 0, DISCOVERY_TIMEOUT_S, "the bridge's subscription")
            chunks.publish(array_msg(np.array([[0.1, 0, 0, 0, 0, 0, -1]] * 2, np.float32), CHUNK_LABELS))
            wait_until(homing.done, 60.0, "homing to end")
            assert homing.result().success, homing.result().message
            time.sleep(1.0)
            assert sent == []  # the chunk that came while homing never ran

            # ~/home cutting a running chunk: no ready while homing (the executing thread announced one
            # as the cut action returned, and the policy planned from an arm on its way home)
            chunks.publish(array_msg(np.array([[0.0, 0.0, 0.1, 0, 0, 0, -1]] * 8, np.float32), CHUNK_LABELS))
            wait_until(lambda: sent, 10.0, "the chunk's first action")
            homing_s = time.monotonic()
            homing = call("home")
            wait_until(homing.done, 60.0, "homing to end")
            assert homing.result().success, homing.result().message
            # counted, not timed against the answer: the ready goes out as homing ends, before the
            # service's answer, which reaches this thread up to a poll period later on a loaded machine
            wait_until(lambda: [t for t in ready if t > homing_s], 5.0, "a ready once homed")
            time.sleep(0.5)
            assert len([t for t in ready if t > homing_s]) == 1  # the one announced once homed, none while homing
        finally:
            bridge.close()
            executor.shutdown()
            context.try_shutdown()
