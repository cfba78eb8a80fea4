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
    ("run_train.sh", {"VLA_EVAL_EPISODES": "-5"}, "VLA_EVAL_EPISODES=-5: a number of held-out episodes, at least 1"),
    ("run_train.sh", {"VLA_WARM_START": "no/such/folder"}, "no/such/folder is not a checkpoint folder (no config.json)"),
    ("make_warm_start.sh", {"VLA_STATE_STAGE_STEPS": "lots"},
     "VLA_STATE_STAGE_STEPS=lots: a number of steps, 0 for no robot-state stage"),
    ("make_warm_start.sh", {"VLA_SFT_STEPS": "0"}, "VLA_SFT_STEPS=0: a number of steps, at least 1"),
    ("make_warm_start.sh", {"VLA_SFT_STAGES": "-1"}, "VLA_SFT_STAGES=-1: a number of continuation stages"),
    ("make_warm_start.sh", {"VLA_FIRST_FRAME_REPEATS": "0"}, "VLA_FIRST_FRAME_REPEATS=0"),
    ("make_warm_start.sh", {"VLA_SCENE_LOSS_WEIGHT": "heavy"}, "VLA_SCENE_LOSS_WEIGHT=heavy: a weight"),
    ("make_warm_start.sh", {"VLA_EXPERT_MAX_SPEED": "-1"}, "VLA_EXPERT_MAX_SPEED=-1"),
    ("make_warm_start.sh", {"VLA_PATCH_POSITIONS": "rope"}, "VLA_PATCH_POSITIONS=rope: use sincos or none"),
    ("make_warm_start.sh", {"VLA_LAYOUT_TOKEN": "mlp"}, "VLA_LAYOUT_TOKEN=mlp: use linear or none"),
])
def test_scripts_refuse_bad_settings_before_setup(tmp_path, script, setting, message):
    out = tmp_path / "out"   # run_train.sh's run dir, make_warm_start.sh's output dir
    args = (str(out),) if script == "make_warm_start.sh" else ()
    result = run_script(script, *args, env={**setting, "VLA_RUN_DIR": str(out), "VLA_VENV": str(tmp_path / "venv")})
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "[setup]" not in result.stderr and not out.exists() and not (tmp_path / "venv").exists()


@pytest.mark.parametrize("args", [("DIR", "--publsh"), ("DIR", "--publish", "extra"), ("--publish",)])
def test_make_warm_start_refuses_unknown_arguments(tmp_path, args):
    args = tuple(str(tmp_path / "warm") if a == "DIR" else a for a in args)
    result = run_script("make_warm_start.sh", *args, env={"VLA_VENV": str(tmp_path / "venv")})
    assert result.returncode == 2
    assert "usage: bash scripts/make_warm_start.sh [DIR] [--publish]" in result.stderr
    assert not (tmp_path / "warm").exists()


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
