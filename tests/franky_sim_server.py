"""franky-sim for tests: a MuJoCo Franka speaking libfranka's network protocol (in its own venv made by
``scripts/setup.sh ...,robot``), started on a free loopback address, and arms connected to it.

``tests/conftest.py`` starts one server per test session (the ``franky_sim`` fixture); the robot and
calibration tests connect to it with the helpers here. The server keeps its state between clients:
tests that need the TCP at a known pose home the arm first (``connected_layer`` does).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FRANKY_SIM_VENV = Path(os.environ.get("VLA_FRANKY_SIM_VENV", ROOT / ".venv-franky-sim"))
LIBFRANKA_PORTS = (1337, 1338)  # robot, gripper: fixed by libfranka
SERVER_START_TIMEOUT_S = 60.0
HOME_TCP_POSITION_M = (0.3069, 0.0, 0.4869)  # franky-sim's FR3 at SafetyLimits' home joints
SERVERS: dict[str, tuple[int, Path]] = {}
"""Address -> (pid, log file) of each server this process runs."""


def free_loopback_address() -> str:
    """A 127.x.y.z address where nothing listens on libfranka's ports, derived from the pid so that
    parallel test runs on one machine pick different ones."""
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    for _ in range(100):
        host = f"127.{100 + os.getpid() % 100}.{rng.randint(1, 254)}.{rng.randint(1, 254)}"
        try:
            for port in LIBFRANKA_PORTS:
                with socket.socket() as s:
                    s.bind((host, port))
            return host
        except OSError:
            continue
    raise RuntimeError("no free loopback address with ports 1337/1338 free")


def franky_sim_executable() -> Path:
    return FRANKY_SIM_VENV / "bin" / "franky-sim"


@contextlib.contextmanager
def running_server(log_dir: Path):
    """Start a franky-sim server, yield its address once it serves, stop it by pid afterwards."""
    host = free_loopback_address()
    log_path = Path(log_dir) / "server.log"
    with open(log_path, "wb") as log:
        # --verbose: the log names every command and reply, which a failed test's report shows the end of
        proc = subprocess.Popen([str(franky_sim_executable()), "--simulator", "mujoco", "--hostname", host,
                                 "--verbose"],
                                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                preexec_fn=die_with_parent)
    try:
        wait_until_serving(proc, host, log_path)
        SERVERS[host] = (proc.pid, log_path)
        yield host
    finally:
        SERVERS.pop(host, None)
        stop_process(proc)  # by pid: the server ignores SIGINT when it runs in the background


def server_log_tail(host: str, lines: int = 60) -> str:
    """The end of a running server's log ("" for an address this process did not start)."""
    if host not in SERVERS:
        return ""
    text = SERVERS[host][1].read_text(errors="replace").splitlines()
    return "\n".join(text[-lines:])


def server_udp_ports(host: str) -> list[int]:
    """The UDP ports a running server's process has bound (Linux /proc): one per connected client."""
    pid = SERVERS[host][0]
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    ports = []
    for line in Path(f"/proc/{pid}/net/udp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[9] in inodes:
            ports.append(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


UDP_COMMAND = struct.Struct("<Q 7d 7d 16d 6d 2d ? ? 7d ?")
"""libfranka's robot command datagram: message id, motion (q, dq, O_T_EE, O_dP_EE, elbow, valid elbow,
motion finished), control (torques, torque finished)."""


def send_motion_finished(host: str, port: int) -> None:
    """Send the robot server a command datagram that says "motion finished", as a stray or late packet
    would: the server ends the running motion with success while the client still runs it."""
    zeros7 = (0.0,) * 7
    packet = UDP_COMMAND.pack(1, *zeros7, *zeros7, *(0.0,) * 16, *(0.0,) * 6, 0.0, 0.0, False, True, *zeros7, False)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(packet, (host, port))


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM a process this test run started, SIGKILL it after 10 s, and reap it."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def die_with_parent() -> None:
    """In the child: SIGTERM it when the test process dies, even by SIGKILL (Linux), so that no
    server outlives a killed test run."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def _can_connect(franky, host: str) -> bool:
    """Open a franky session in a throwaway thread: libfranka raises the connecting thread to
    SCHED_FIFO 99 (also with ``RealtimeConfig.Ignore``, where it may), and pytest's main thread at
    realtime priority would pass it on to every process a later test starts."""
    result = []

    def probe() -> None:
        try:
            franky.Robot(host, realtime_config=franky.RealtimeConfig.Ignore)
            result.append(True)
        except franky.NetworkException:
            pass

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(5.0)
    return bool(result)


def wait_until_serving(proc: subprocess.Popen, host: str, log_path: Path) -> None:
    """Block until a franky client can open a session on the server."""
    import franky

    deadline_s = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"franky-sim exited with {proc.returncode}:\n{log_path.read_text()}")
        if b"Connect to the server" in log_path.read_bytes() and _can_connect(franky, host):
            return
        if time.monotonic() > deadline_s:
            raise RuntimeError(f"franky-sim did not serve within {SERVER_START_TIMEOUT_S} s:\n{log_path.read_text()}")
        time.sleep(0.1)


def sim_arm_config(host: str, **overrides):
    from real_robot.franky_arm import FrankyArmConfig

    return FrankyArmConfig(**{"robot_ip": host, "ignore_realtime": True, "relative_dynamics_factor": 0.5, **overrides})


def sim_limits(**overrides):
    """Limits for the simulated arm: a box of +/-6 cm around the home TCP, faster dynamics than the
    real robot's defaults (the sim has no people near it)."""
    from real_robot.safety import SafetyLimits

    x, y, z = HOME_TCP_POSITION_M
    values = dict(workspace_min_m=(x - 0.06, y - 0.06, z - 0.06), workspace_max_m=(x + 0.06, y + 0.06, z + 0.06),
                  max_relative_dynamics_factor=0.5, max_translation_per_step_m=0.05, max_rotation_per_step_rad=0.1,
                  gripper_min_interval_s=0.0, watchdog_timeout_s=5.0)
    values.update(overrides)
    return SafetyLimits(**values)


HOMING_ATTEMPTS = 3


@contextlib.contextmanager
def connected_layer(host: str, arm_overrides: dict | None = None, home: bool = True, **limit_overrides):
    """A connected FrankyArm on franky-sim behind a SafetyLayer (homed unless ``home=False``)."""
    from real_robot.errors import MotionError
    from real_robot.franky_arm import FrankyArm
    from real_robot.safety import SafetyLayer

    for attempt in range(HOMING_ATTEMPTS if home else 0):  # at the sim's fastest allowed speed
        try:
            with FrankyArm(sim_arm_config(host)) as homing_arm, SafetyLayer(homing_arm, sim_limits()) as homing:
                homing.home()
            break
        except MotionError as e:
            # franky-sim has ended a homing move on its own (libfranka then reads an unexpected reply,
            # and cancels the motion): homing is this helper's precondition, not the code under test.
            # Seen twice in a row on one connection: each try gets a new one, after a pause.
            if attempt == HOMING_ATTEMPTS - 1:
                raise
            warnings.warn(f"franky-sim: homing failed ({e}); homing again on a new connection. The server's "
                          f"log ends:\n{server_log_tail(host)}", RuntimeWarning, stacklevel=3)
            time.sleep(1.0)
    arm = FrankyArm(sim_arm_config(host, **(arm_overrides or {})))
    arm.connect()
    try:
        layer = SafetyLayer(arm, sim_limits(**limit_overrides))
        try:
            yield layer
        finally:
            layer.close()
    finally:
        arm.disconnect()


def settled_position_m(layer, timeout_s: float = 3.0):
    """The TCP position once the arm has come to rest (two readings 0.1 s apart within 0.2 mm).
    franky-sim's arm lags its commanded motion and keeps moving for a while after a stop."""
    import numpy as np

    deadline_s = time.monotonic() + timeout_s
    previous = layer.observation().tcp_position_m
    while True:
        time.sleep(0.1)
        now = layer.observation().tcp_position_m
        if np.linalg.norm(now - previous) < 2e-4:
            return now
        if time.monotonic() > deadline_s:
            raise AssertionError(f"the arm is still moving after {timeout_s} s ({previous} -> {now})")
        previous = now
