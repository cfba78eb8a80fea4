"""Synthetic demonstration folders for the SFT and behaviour-cloning tests: random images, a
deterministic action pattern, written with the real ``EpisodeRecorder``."""

from __future__ import annotations

import numpy as np

from vla_envs.demos import EpisodeRecorder

EPISODES, STEPS, IMAGE = 3, 12, 64
INSTRUCTIONS = ("pick up the cube", "push the block left", "open the drawer")


def expert_action(episode: int, t: int) -> np.ndarray:
    """A simple deterministic action pattern in [-1, 1] (gripper flips halfway)."""
    return np.array([np.sin(0.5 * t + episode), np.cos(0.3 * t), 0.5 * (episode - 1),
                     0.1 * t / STEPS, -0.2, 0.0, 1.0 if t < STEPS // 2 else -1.0], np.float32)


def write_demos(folder, image_size: int = IMAGE, seed: int = 0, episodes: int = EPISODES, steps: int = STEPS,
                state_dim: int = 9):
    rng = np.random.default_rng(seed)
    recorder = EpisodeRecorder(folder, num_envs=1, env_id="Synthetic-v0", asset_pack=None, only_success=True)
    for ep in range(episodes):
        for t in range(steps):
            obs = {"image": rng.integers(0, 256, (1, image_size, image_size, 3), dtype=np.uint8),
                   "state": rng.standard_normal((1, state_dim)).astype(np.float32)}
            recorder.add(obs, expert_action(ep, t)[None], np.zeros(1, np.float32), np.array([t == steps - 1]))
        recorder.finish(0, INSTRUCTIONS[ep], ep, {"success_once": 1.0, "success_at_end": 1.0, "return": 1.0})
    return folder
