"""real_robot loads no numpy, vendor SDK or env/trainer code on import, and names the extra when an
SDK is missing."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from real_robot.errors import MissingExtraError, require_module

PACKAGE = Path(__file__).resolve().parents[2] / "real_robot"
MODULES = sorted(f"real_robot.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__")


def test_importing_every_module_loads_no_heavy_dependency():
    code = (f"import sys, real_robot, {', '.join(MODULES)}\n"
            "print(sorted(m for m in ('numpy', 'franky', 'pyrealsense2', 'rclpy', 'cv2', 'yaml', 'vla_envs', "
            "'vla_trainer', 'torch') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_no_module_imports_the_env_or_trainer_packages():
    for path in PACKAGE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] not in ("vla_envs", "vla_trainer"), f"{path.name} imports {name}"


def test_a_missing_sdk_names_the_extra():
    with pytest.raises(MissingExtraError, match=r'no_such_sdk is not installed .*pip install "vla-rl\[robot\]"'):
        require_module("no_such_sdk", extra="robot")
    assert issubclass(MissingExtraError, ImportError)
