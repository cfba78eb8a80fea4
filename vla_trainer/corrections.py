"""Correction demos: the policy starts an episode, the scripted expert takes over and finishes it.

Behaviour cloning learns from the expert's own states only, so a policy that reaches a few
centimetres off finds itself where no demo ever was, and its next chunk has nothing to copy
(the covariate shift DAgger was made for). Here the policy acts for the first ``h`` steps of
an episode (``h`` drawn per episode from ``handover_steps``), the expert then takes over from
the state the policy left (``take_over``: carry on if the gripper holds the object, descend if
already above it, otherwise go back above it) and acts to the end; only the expert's part is
recorded, in the demo format of ``vla_envs.demos`` (with the scene poses), so
``vla-train sft --demos <demos> <corrections>`` trains on both. Every recorded chunk is a real
expert trajectory from a state the policy reached, which per-step DAgger labels along the
policy's own path would not be.

Shapes: ``N`` envs, chunk ``C`` (the policy's), actions ``[N, 1, 7]`` per env step.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vla_envs.demos import SCENE_BODIES, EpisodeRecorder, scene_poses

from .models import VLAPolicy


def check_handover_steps(handover_steps: list[int], chunk_size: int, time_limit: int) -> None:
    """Raise a ValueError unless every hand-over step is a whole number of the policy's chunks,
    at least one chunk and short of the time limit."""
    bad = [h for h in handover_steps if h < chunk_size or h % chunk_size or h >= time_limit]
    if not handover_steps or bad:
        raise ValueError(f"handover steps {handover_steps}: each must be a positive multiple of the policy's "
                         f"chunk ({chunk_size}) below the episode's time limit ({time_limit})")


def collect_corrections(policy: VLAPolicy, env_id: str, out_dir: str | Path, num_episodes: int, *,
                        handover_steps: list[int], num_envs: int = 2, env_kwargs: dict | None = None,
                        temperature: float = 0.6, seed: int = 0, only_success: bool = True) -> dict:
    """Runs ``num_episodes`` policy-then-expert episodes of ``env_id`` (``num_envs`` envs at the
    policy's image size, auto-reset, ``env_kwargs``) and records the expert's parts in ``out_dir``.

    Returns a summary: episodes, kept, frames recorded, episodes the policy finished before the
    hand-over, the expert's success after it.

    Raises:
        ValueError: bad ``handover_steps`` / ``num_episodes``, or a task without a scripted expert.
    """
    import gymnasium as gym

    from vla_envs.registry import get_task

    spec = get_task(env_id)
    if not spec.expert:
        raise ValueError(f"{env_id} has no scripted expert to take over")
    if num_episodes < 1:
        raise ValueError(f"num_episodes={num_episodes} must be >= 1")
    kwargs = {"image_size": policy.config.image_size, **(env_kwargs or {}), "auto_reset": True}
    env = gym.make(env_id, num_envs=num_envs, **kwargs)
    try:
        return _collect(env, spec, policy, out_dir, num_episodes, handover_steps, temperature, seed, only_success)
    finally:
        env.close()


def _collect(env, spec, policy: VLAPolicy, out_dir, num_episodes: int, handover_steps: list[int],
             temperature: float, seed: int, only_success: bool) -> dict:
    base = env
    C = policy.chunk_size
    check_handover_steps(handover_steps, C, base.max_episode_steps)
    n = env.num_envs
    module, _, name = spec.expert.partition(":")
    expert = getattr(importlib.import_module(module), name)(n)
    recorder = EpisodeRecorder(out_dir, n, spec.id, getattr(base, "asset_pack", None), only_success=only_success,
                               scene_bodies=SCENE_BODIES,
                               expert_kwargs={"take_over_after_steps": list(handover_steps)})
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)

    obs, info = env.reset(seed=seed)
    state_ids = info["state_id"]
    step = np.zeros(n, np.int64)  # env steps into the current episode
    handover = rng.choice(handover_steps, n)
    queue = np.zeros((n, C, 7), np.float32)  # the policy's chunk being executed, per env
    episodes, kept, frames, policy_success = 0, 0, 0, 0
    expert_success: list[float] = []
    bar = tqdm(total=num_episodes, desc="corrections", unit="episode", file=sys.stderr)
    try:
        while episodes < num_episodes:
            by_expert = step >= handover
            if (~by_expert & (step % C == 0)).any():
                chunk = policy.act(obs, temperature=temperature, generator=generator).actions.cpu().numpy()
                refill = ~by_expert & (step % C == 0)
                queue[refill] = chunk[refill]
            states = [base.backend.call(i, "expert_state") for i in range(n)]
            starting = np.flatnonzero(by_expert & (step == handover))
            if starting.size:
                expert.take_over(starting, [states[i] for i in starting])
            actions = queue[np.arange(n), step % C][:, None, :].copy()
            if by_expert.any():
                actions[by_expert, 0] = expert.act(states)[by_expert]
            instructions = obs["instruction"]  # the episode's, before an auto-reset replaces it
            out = env.chunk_step(actions)
            recorder.add(obs, actions[:, 0], out.rewards[:, 0], out.info["success"][:, 0], scene_poses(states),
                         envs=by_expert)
            frames += int(by_expert.sum())
            step += 1
            obs = out.obs
            if "episode" in out.info:
                ep, done = out.info["episode"], out.info["_episode"]
                for i in np.flatnonzero(done):
                    episode = {k: float(ep[k][i]) for k in ep}
                    if by_expert[i]:
                        kept += recorder.finish(i, instructions[i], int(state_ids[i]), episode)
                        expert_success.append(episode["success_once"])
                    else:  # finished before the hand-over (solved or timed out): nothing recorded
                        policy_success += int(episode["success_once"])
                        recorder.finish(i, instructions[i], int(state_ids[i]), episode)
                    episodes += 1
                    bar.update(1)
                    step[i] = 0
                    handover[i] = rng.choice(handover_steps)
                expert.reset(np.flatnonzero(done))
            state_ids = out.info["state_id"]
            bar.set_postfix(kept=kept, expert_success=f"{np.mean(expert_success) if expert_success else 0:.2f}")
    finally:
        bar.close()
    return {"episodes": episodes, "kept": kept, "frames_recorded": frames,
            "policy_solved_before_handover": policy_success,
            "expert_success_after_handover": float(np.mean(expert_success)) if expert_success else None,
            "handover_steps": list(handover_steps), "temperature": temperature, "seed": seed,
            "demo_folder": str(out_dir)}
