"""scripts/setup.sh with the robot extra: the franky-sim venv is made once and skipped after, and
never touched without the extra. A python that fails stands in for any install step."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT_HASH = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]
FRANKY_SIM_SPEC = "franky-sim==1.0.4"


def run_setup(extras: str, venv: Path, sim_venv: Path) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("VLA_")},
           "VLA_VENV": str(venv), "VLA_FRANKY_SIM_VENV": str(sim_venv), "PYTHON": "false"}
    return subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), extras], capture_output=True, text=True,
                          env=env, timeout=60)


def stamp(venv: Path, text: str) -> None:
    venv.mkdir()
    (venv / ".vla-setup-stamp").write_text(f"{text}\n")


def test_setup_is_skipped_when_both_venvs_are_done(tmp_path):
    venv, sim_venv = tmp_path / "venv", tmp_path / "sim"
    stamp(venv, f"{PROJECT_HASH} maniskill,libero,dev,robot")
    stamp(sim_venv, FRANKY_SIM_SPEC)
    result = run_setup("maniskill,libero,dev,robot", venv, sim_venv)
    assert result.returncode == 0, result.stderr
    assert "creating" not in result.stderr and "installing" not in result.stderr


@pytest.mark.parametrize("sim_stamp", [None, "franky-sim==1.0.3"])
def test_franky_sim_venv_is_made_when_missing_or_outdated(tmp_path, sim_stamp):
    venv, sim_venv = tmp_path / "venv", tmp_path / "sim"
    stamp(venv, f"{PROJECT_HASH} maniskill,libero,dev,robot")
    if sim_stamp:
        stamp(sim_venv, sim_stamp)
    result = run_setup("robot", venv, sim_venv)
    assert result.returncode != 0  # the failing python: it did try
    assert f"creating {sim_venv} (the franky-sim server)" in result.stderr
    assert "installing the project" not in result.stderr  # the project venv was complete


def test_without_the_robot_extra_the_franky_sim_venv_is_left_alone(tmp_path):
    venv, sim_venv = tmp_path / "venv", tmp_path / "sim"
    stamp(venv, f"{PROJECT_HASH} maniskill,libero,dev")
    result = run_setup("maniskill,dev", venv, sim_venv)
    assert result.returncode == 0, result.stderr
    assert not sim_venv.exists()


def test_the_test_command_asks_for_the_robot_and_ros_extras():
    assert 'setup.sh" maniskill,libero,dev,robot,ros,ros-build\n' in (ROOT / "scripts" / "run_tests.sh").read_text()


def test_the_ros_test_interfaces_are_built_once_per_definition(tmp_path):
    """The build is skipped while the venv's stamp holds the definitions' hash (here: the suite's own
    venv's stamp, made by this checkout's setup), and run again once a definition changes."""
    stamp_file = ROOT / ".venv" / ".vla-ros-interfaces-stamp"
    if not stamp_file.exists():
        pytest.skip("this checkout's venv was set up without the ros-build extra")
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "python").symlink_to("/bin/false")  # any build step would fail
    (venv / ".vla-ros-interfaces-stamp").write_text(stamp_file.read_text())
    build = ["bash", str(ROOT / "scripts" / "build_ros_test_interfaces.sh"), str(venv)]
    done = subprocess.run(build, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    (venv / ".vla-ros-interfaces-stamp").write_text("0000000000000000\n")  # built from other definitions
    again = subprocess.run(build, capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "Python.h" in again.stderr, again.stderr  # it tried: the python fails


def test_the_franky_sim_venv_is_git_ignored():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    ignored = subprocess.run(["git", "check-ignore", "-q", ".venv-franky-sim/bin/python"], cwd=ROOT).returncode
    assert ignored == 0
