"""The README's first lines in a plain script, at its top level, without an
``if __name__ == "__main__":`` guard: the pool's workers must not re-run the script."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]

SCRIPT = """
import gymnasium as gym
import numpy as np
import vla_envs  # registers the ids

print("script body runs", flush=True)
env = gym.make("PutOnPlateInScene25Main-v3", num_envs=2, image_size=64, low_poly=True)
obs, info = env.reset(seed=0)
out = env.chunk_step(np.zeros((2, 2, 7), np.float32))
print("shapes", obs["image"].shape, out.rewards.shape, flush=True)
env.close()
"""


def test_the_readme_snippet_runs_in_a_script_without_a_main_guard(tmp_path):
    script = tmp_path / "snippet.py"
    script.write_text(textwrap.dedent(SCRIPT))
    env = {**os.environ, "VLA_ENVS_ASSET_DIR": str(tmp_path / "assets"), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=400, env=env,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "shapes (2, 64, 64, 3) (2, 2)" in out.stdout
    assert out.stdout.count("script body runs") == 1  # the workers did not run the script again
