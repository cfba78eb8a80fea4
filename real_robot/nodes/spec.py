"""One description of a ROS 2 node process, used both by the launch file and without the ROS 2 CLI.

A ``NodeSpec`` is data: the node's name, the Python module that runs it (``python -m module``), its
parameters and its topic remappings. ``NodeSpec.argv`` renders the command line rclpy parses::

    python -m real_robot.nodes.bridge_node --ros-args -r __node:=franka_bridge -p robot_ip:='172.16.0.2' \\
        -p dry_run:=true -r from:=to

``start_nodes`` starts specs as subprocesses, ``stop_nodes`` ends them (SIGTERM, wait, SIGKILL).
``launch/franka_eval.launch.py`` builds ``launch_ros.actions.Node`` actions from the same specs, so
``ros2 launch`` and a program that starts the nodes itself run the same command lines.

Standard library only: the launch file imports this module in whatever Python runs ``ros2 launch``.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Iterable, Mapping, Sequence, Union

Scalar = Union[bool, int, float, str]
ParameterValue = Union[Scalar, Sequence[bool], Sequence[int], Sequence[float], Sequence[str]]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PARAMETER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_TOPIC = re.compile(r"^(~/|/)?[A-Za-z_][A-Za-z0-9_]*(/[A-Za-z_][A-Za-z0-9_]*)*$")
_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


@dataclass(frozen=True)
class NodeSpec:
    """One node process: what runs, under which name, with which parameters and remappings."""

    name: str
    """The ROS node name (``-r __node:=name``)."""
    module: str
    """The Python module that runs the node: ``python -m module``."""
    parameters: Mapping[str, ParameterValue] = field(default_factory=dict)
    """Parameter values: bool, int, float, str, or a non-empty list of one of those. Leave a
    parameter out to keep the node's default (ROS parameters have no null and no typed empty list)."""
    remappings: tuple[tuple[str, str], ...] = ()
    """``(from, to)`` topic remappings, in order."""
    description: str = ""
    """What the node does, for logs and docs."""

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"node name {self.name!r}: letters, digits and underscores, not starting with a digit")
        if not _MODULE.match(self.module):
            raise ValueError(f"module {self.module!r}: a dotted Python module name")
        params = dict(self.parameters)
        for key, value in params.items():
            if not isinstance(key, str) or not _PARAMETER_NAME.match(key):
                raise ValueError(f"{self.name}: parameter name {key!r}: letters, digits, underscores and dots")
            format_parameter_value(value, f"{self.name}.{key}")  # raises on what ROS cannot carry
        remaps = tuple((str(a), str(b)) for a, b in self.remappings)
        for source, target in remaps:
            for topic in (source, target):
                if not _TOPIC.match(topic):
                    raise ValueError(f"{self.name}: remapping {source!r} -> {target!r}: {topic!r} is not a topic name")
        object.__setattr__(self, "parameters", params)
        object.__setattr__(self, "remappings", remaps)

    def ros_arguments(self) -> list[str]:
        """``['--ros-args', '-r', '__node:=name', '-p', 'k:=v', ..., '-r', 'from:=to', ...]``."""
        args = ["--ros-args", "-r", f"__node:={self.name}"]
        for key, value in self.parameters.items():
            args += ["-p", f"{key}:={format_parameter_value(value, key)}"]
        for source, target in self.remappings:
            args += ["-r", f"{source}:={target}"]
        return args

    def argv(self, python: str | None = None) -> list[str]:
        """The command line: ``[python, '-m', module, '--ros-args', ...]`` (``python``: this interpreter)."""
        return [python or sys.executable, "-m", self.module, *self.ros_arguments()]


def format_parameter_value(value: ParameterValue, name: str = "value") -> str:
    """A parameter value as the YAML rclpy reads after ``-p name:=``, keeping its type: strings are
    single-quoted (a camera serial stays a string), floats always carry a decimal point.

    Raises:
        ValueError: None, NaN or infinity, an empty or mixed list, or another type.
    """
    if isinstance(value, (list, tuple)):
        if not value:
            raise ValueError(f"{name}: an empty list has no ROS type; leave the parameter out instead")
        kinds = {_kind(v, name) for v in value}
        if len(kinds) > 1 and kinds != {int, float}:
            raise ValueError(f"{name}={list(value)!r}: the items of a list parameter share one type")
        if kinds == {int, float}:
            value = [float(v) for v in value]
        return "[" + ", ".join(_scalar(v, name) for v in value) + "]"
    _kind(value, name)
    return _scalar(value, name)


def _kind(value: object, name: str) -> type:
    for kind in (bool, int, float, str):  # bool before int: True is an int too
        if isinstance(value, kind):
            return kind
    raise ValueError(f"{name}={value!r}: a parameter is a bool, int, float, str or a list of one of those")


def _scalar(value: Scalar, name: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"{name}={value!r}: a finite number")
        text = repr(value)
        if "." not in text:  # 1e-05 -> 1.0e-05: YAML reads exponents without a point as strings
            text = text.replace("e", ".0e") if "e" in text else text + ".0"
        return text
    return "'" + value.replace("'", "''") + "'"


# ----- running specs as processes -----------------------------------------------------------------

def local_ros_env(domain_id: int | None, localhost: bool = True) -> dict[str, str]:
    """Environment variables for the nodes' DDS: ``domain_id`` (None: the inherited
    ``ROS_DOMAIN_ID``, as ``ros2 launch`` uses) and, with ``localhost``, discovery kept on this
    machine (not when a node must find a ROS 2 stack on another host, e.g. the robot PC's)."""
    if domain_id is not None and not (isinstance(domain_id, int) and 0 <= domain_id <= 232):
        raise ValueError(f"domain_id={domain_id!r}: an integer in [0, 232]")
    env = {} if domain_id is None else {"ROS_DOMAIN_ID": str(domain_id)}
    return env | ({"ROS_AUTOMATIC_DISCOVERY_RANGE": "LOCALHOST"} if localhost else {})


def start_nodes(specs: Iterable[NodeSpec], env: Mapping[str, str] | None = None, *, python: str | None = None,
                log_dir: str | Path | None = None, die_with_parent: bool = True) -> list[subprocess.Popen]:
    """Start each spec as ``python -m module --ros-args ...``.

    Args:
        specs: the nodes.
        env: variables set over this process's environment (e.g. ``local_ros_env(42)``).
        python: the interpreter (default: this one).
        log_dir: write each node's stdout and stderr to ``log_dir/<name>.log``; None: inherit ours.
        die_with_parent: on Linux, the node gets SIGTERM when the thread that started it ends (so
            no node outlives a killed parent); start nodes from the main thread.

    Every node starts with ordinary (not realtime) scheduling, whatever this process runs with.

    Returns:
        The processes, in the order of ``specs``. If one fails to start, those started are stopped.
    """
    full_env = {**os.environ, **(env or {})}
    procs: list[subprocess.Popen] = []
    try:
        for spec in specs:
            log: IO[bytes] | None = None
            if log_dir is not None:
                Path(log_dir).mkdir(parents=True, exist_ok=True)
                log = open(Path(log_dir) / f"{spec.name}.log", "ab")
            try:
                procs.append(subprocess.Popen(
                    spec.argv(python), env=full_env, stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT if log is not None else None,
                    preexec_fn=_child_setup_die_with_parent if die_with_parent else _child_setup))
            finally:
                if log is not None:
                    log.close()  # the child has its own descriptor
    except BaseException:
        stop_nodes(procs)
        raise
    return procs


def stop_nodes(procs: Iterable[subprocess.Popen], timeout_s: float = 10.0) -> list[int]:
    """SIGTERM every running process, wait up to ``timeout_s`` for all of them together, then
    SIGKILL those left.

    Returns:
        The exit codes, in order (a negative code: ended by that signal).
    """
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline_s = time.monotonic() + timeout_s
    codes = []
    for proc in procs:
        try:
            codes.append(proc.wait(max(0.0, deadline_s - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            codes.append(proc.wait())
    return codes


def _child_setup() -> None:
    """In the child: ordinary scheduling. A thread that opened a franky connection runs SCHED_FIFO 99
    (libfranka raises it, even with ``RealtimeConfig.Ignore`` where it is allowed to), and a process
    forked from it would inherit that: busy Python threads at realtime priority starve the machine."""
    if hasattr(os, "sched_setscheduler"):
        try:
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        except OSError:
            pass


def _child_setup_die_with_parent() -> None:
    _child_setup()
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
