"""The README's scripts refuse bad settings before they set anything up or start work, and
setup is skipped when an earlier install already had the extras asked for."""

from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def run_script(script: str, *args: str, env: dict[str, str] | None = None, cwd: Path = ROOT):
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("VLA_")}
    full_env.update(env or {})
    return subprocess.run(["bash", str(ROOT / "scripts" / script), *args], env=full_env, cwd=cwd,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("script, setting, message", [
    ("run_train.sh", {"VLA_ALGORITHM": "sac"}, "VLA_ALGORITHM=sac: use grpo or ppo"),
    ("run_train.sh", {"VLA_TASK": "medium"}, "VLA_TASK=medium: use easy (the curriculum variant, the default) or full"),
    ("run_train.sh", {"VLA_ALGORITHM": "ppo"}, "the easy task has a GRPO recipe only; use VLA_TASK=full for PPO"),
    ("run_train.sh", {"VLA_RL_MINUTES": "forty"}, "VLA_RL_MINUTES=forty: minutes of RL wall time"),
    ("run_train.sh", {"VLA_RL_MINUTES": "0"}, "VLA_RL_MINUTES=0: minutes of RL wall time, a number above 0"),
    ("run_train.sh", {"VLA_EVAL_EPISODES": "-5"}, "VLA_EVAL_EPISODES=-5: a number of held-out episodes, a positive multiple of 4"),
    ("run_train.sh", {"VLA_EVAL_EPISODES": "10"}, "VLA_EVAL_EPISODES=10: a number of held-out episodes, a positive multiple of 4"),
    ("run_train.sh", {"VLA_WARM_START": "no/such/folder"}, "no/such/folder is not a checkpoint folder (no config.json)"),
])
def test_scripts_refuse_bad_settings_before_setup(tmp_path, script, setting, message):
    out = tmp_path / "out"   # run_train.sh's run dir
    result = run_script(script, env={**setting, "VLA_RUN_DIR": str(out), "VLA_VENV": str(tmp_path / "venv")})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "[setup]" not in result.stderr and not out.exists() and not (tmp_path / "venv").exists()


@pytest.mark.parametrize("args, message", [
    (("tiny_put_on_plate_eazy",), "warm-start recipe 'tiny_put_on_plate_eazy': shipped ones: tiny_put_on_plate "
                                  "tiny_put_on_plate_easy"),
    (("no/such.yaml",), "recipe file no/such.yaml does not exist"),
    (("tiny_put_on_plate", "--publsh"), "argument '--publsh': usage: bash scripts/make_warm_start.sh [RECIPE]"),
    (("tiny_put_on_plate", "--out"), "--out needs a folder"),
    (("tiny_put_on_plate", "--out", "DIR", "extra"), "argument 'extra'"),
])
def test_make_warm_start_refuses_unknown_arguments_before_setup(tmp_path, args, message):
    args = tuple(str(tmp_path / "warm") if a == "DIR" else a for a in args)
    result = run_script("make_warm_start.sh", *args, env={"VLA_VENV": str(tmp_path / "venv")})
    assert result.returncode == 2
    assert message in result.stderr
    assert not (tmp_path / "warm").exists() and not (tmp_path / "venv").exists()


def stamp(venv: Path, *lines: str) -> None:
    venv.mkdir()
    (venv / ".vla-setup-stamp").write_text("".join(f"{line}\n" for line in lines))


PROJECT_HASH = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()[:16]


@pytest.mark.parametrize("installed, asked", [
    ("maniskill,libero,dev", "maniskill"),
    ("maniskill,libero,dev", "dev,maniskill"),
    ("maniskill", "maniskill"),
])
def test_setup_is_skipped_when_an_install_had_every_extra(tmp_path, installed, asked):
    venv = tmp_path / "venv"
    stamp(venv, f"0123456789abcdef {asked}", f"{PROJECT_HASH} {installed}")
    # a python that fails: any install step would stop the script with an error
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), asked], capture_output=True, text=True,
                            env={**os.environ, "VLA_VENV": str(venv), "PYTHON": "false"}, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "creating" not in result.stderr and "installing the project" not in result.stderr


@pytest.mark.parametrize("installed, asked", [
    ("maniskill", "maniskill,dev"),          # an extra missing
    ("maniskill,libero", "mani"),            # a prefix of an extra is not the extra
])
def test_setup_runs_when_an_extra_is_missing_or_the_project_changed(tmp_path, installed, asked):
    venv = tmp_path / "venv"
    stamp(venv, f"{PROJECT_HASH} {installed}", f"0123456789abcdef {asked}")
    result = subprocess.run(["bash", str(ROOT / "scripts" / "setup.sh"), asked], capture_output=True, text=True,
                            env={**os.environ, "VLA_VENV": str(venv), "PYTHON": "false"}, timeout=60)
    assert result.returncode != 0 and f"creating {venv}" in result.stderr
