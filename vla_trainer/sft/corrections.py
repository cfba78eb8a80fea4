"""Correction demos: the policy starts an episode, the scripted expert takes over and finishes it.

Behaviour cloning learns from the expert's own states only, so a policy that reaches a few
centimetres off finds itself where no demo ever was, and its next chunk has nothing to copy
(the covariate shift DAgger was made for). Here the policy acts for the first ``h`` steps of
an episode (``h`` drawn per episode from ``handover_steps``; with ``grasp_delays``, ``d`` steps
after the policy's own first grasp when that comes sooner, ``d`` drawn per episode, so that the
expert also takes over the policy's carries, which a fixed step rarely finds), the expert then takes over from
the state the policy left (``take_over``: carry on if the gripper holds the object, descend if
already above it, otherwise go back above it) and acts to the end; only the expert's part is
recorded, in the demo format of ``vla_envs.demos`` (with the scene poses), so
``vla-train sft --demos <demos> <corrections>`` trains on both. Every recorded chunk is a real
expert trajectory from a state the policy reached, which per-step DAgger labels along the
policy's own path would not be.

Shapes: ``N`` envs, chunk ``C`` (the policy's), actions ``[N, 1, 7]`` per env step.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from vla_envs.core.backend import env_rows
from vla_envs.demos import SCENE_BODIES, EpisodeRecorder, scene_poses

from vla_trainer.models import VLAPolicy


def check_handover_steps(handover_steps: list[int], chunk_size: int, time_limit: int) -> None:
    """Raise a ValueError unless every hand-over step is a whole number of the policy's chunks,
    at least one chunk and short of the time limit."""
    bad = [h for h in handover_steps if h < chunk_size or h % chunk_size or h >= time_limit]
    if not handover_steps or bad:
        raise ValueError(f"handover steps {handover_steps}: each must be a positive multiple of the policy's "
                         f"chunk ({chunk_size}) below the episode's time limit ({time_limit})")


def check_grasp_delays(grasp_delays: list[int], time_limit: int) -> None:
    """Raise a ValueError unless every delay after the first grasp is in ``[0, time_limit)``."""
    bad = [d for d in grasp_delays if not 0 <= d < time_limit]
    if bad:
        raise ValueError(f"grasp delays {grasp_delays}: each must be in [0, {time_limit}) env steps "
                         f"(the episode's time limit)")


def collect_corrections(policy: VLAPolicy, env_id: str, out_dir: str | Path, num_episodes: int, *,
                        handover_steps: list[int], grasp_delays: list[int] | None = None, only_held: bool = False,
                        num_envs: int = 2, env_kwargs: dict | None = None, temperature: float = 0.6,
                        seed: int = 0, only_success: bool = True, expert_options: dict | None = None) -> dict:
    """Runs ``num_episodes`` policy-then-expert episodes of ``env_id`` (``num_envs`` envs at the
    policy's image size, auto-reset, ``env_kwargs``) and records the expert's parts in ``out_dir``.

    The hand-over of an episode is at a step drawn from ``handover_steps`` or, with
    ``grasp_delays``, ``d`` (drawn) steps after the first step the policy holds the object,
    whichever comes first. ``only_held`` keeps only episodes handed over while the gripper held
    the object (the expert's carry and release from the policy's own grasp). Each kept episode's
    index entry gives its ``handover_step`` and ``held_at_handover``. ``expert_options``: the scripted
    expert's own keyword options (as ``vla-envs collect-demos --expert-kwargs``), so corrections can be
    made at the speed of the demos they join.

    Returns a summary: episodes, kept, frames in the kept episodes, episodes the policy finished before the
    hand-over, hand-overs made while the object was held, the expert's success after them.

    Raises:
        ValueError: bad ``handover_steps`` / ``grasp_delays`` / ``num_episodes``, or a task without
            a scripted expert (or, with ``grasp_delays`` or ``only_held``, one whose expert state
            does not say whether the object is held), or ``expert_options`` it does not take.
    """
    import gymnasium as gym

    from vla_envs.registry import get_task

    spec = get_task(env_id)
    if not spec.expert:
        raise ValueError(f"{env_id} has no scripted expert to take over")
    spec.make_expert(num_envs, options=expert_options)  # options it refuses: said before the env is built
    if num_episodes < 1:
        raise ValueError(f"num_episodes={num_episodes} must be >= 1")
    kwargs = {"image_size": policy.config.image_size, **(env_kwargs or {}), "auto_reset": True}
    env = gym.make(env_id, num_envs=num_envs, **kwargs)
    try:
        return _collect(env, spec, policy, out_dir, num_episodes, handover_steps, grasp_delays or [], only_held,
                        temperature, seed, only_success, kwargs, expert_options)
    finally:
        env.close()


def _collect(env, spec, policy: VLAPolicy, out_dir, num_episodes: int, handover_steps: list[int],
             grasp_delays: list[int], only_held: bool, temperature: float, seed: int, only_success: bool,
             env_kwargs: dict | None = None, expert_options: dict | None = None) -> dict:
    base = env
    C = policy.chunk_size
    check_handover_steps(handover_steps, C, base.max_episode_steps)
    check_grasp_delays(grasp_delays, base.max_episode_steps)
    n = env.num_envs
    expert = spec.make_expert(n, options=expert_options)
    expert_kwargs = {**(expert_options or {}), "take_over_after_steps": list(handover_steps)}
    if grasp_delays:
        expert_kwargs["take_over_after_grasp_steps"] = list(grasp_delays)
    if only_held:
        expert_kwargs["only_held"] = True
    recorder = EpisodeRecorder(out_dir, n, spec.id, getattr(base, "asset_pack", None), only_success=only_success,
                               scene_bodies=SCENE_BODIES, expert_kwargs=expert_kwargs, env_kwargs=env_kwargs)
    rng = np.random.default_rng(seed)
    generator = torch.Generator().manual_seed(seed)

    obs, info = env.reset(seed=seed)
    state_ids = info["state_id"]
    step = np.zeros(n, np.int64)  # env steps into the current episode
    handover = rng.choice(handover_steps, n)
    delay = rng.choice(grasp_delays, n) if grasp_delays else np.zeros(n, np.int64)
    grasped_yet = np.zeros(n, bool)  # the policy has held the object in this episode
    held_at_handover = np.zeros(n, bool)
    expert_steps = np.zeros(n, np.int64)  # steps recorded in the current episode
    queue = np.zeros((n, C, 7), np.float32)  # the policy's chunk being executed, per env
    episodes, kept, frames, policy_success, held_handovers = 0, 0, 0, 0, 0
    expert_success: list[float] = []
    bar = tqdm(total=num_episodes, desc="corrections", unit="episode", file=sys.stderr)
    try:
        while episodes < num_episodes:
            states = env_rows(base.expert_state())
            if (grasp_delays or only_held) and "grasped" not in states[0]:
                raise ValueError(f"{spec.id}'s expert state does not say whether the object is held "
                                 f"(no 'grasped'), so hand-overs cannot follow the policy's grasp")
            if grasp_delays:
                held = np.array([bool(s["grasped"]) for s in states])
                first = held & ~grasped_yet & (step < handover)
                grasped_yet |= held
                handover[first] = np.minimum(handover[first], step[first] + delay[first])
            by_expert = step >= handover
            refill = ~by_expert & (step % C == 0)
            if refill.any():
                chunk = policy.act(obs, temperature=temperature, generator=generator).actions.cpu().numpy()
                queue[refill] = chunk[refill]
            starting = np.flatnonzero(by_expert & (step == handover))
            if starting.size:
                expert.take_over(starting, [states[i] for i in starting])
                held_at_handover[starting] = [bool(states[i].get("grasped", False)) for i in starting]
            actions = queue[np.arange(n), step % C][:, None, :].copy()
            if by_expert.any():
                actions[by_expert, 0] = expert.act(states)[by_expert]
            instructions = obs["instruction"]  # the episode's, before an auto-reset replaces it
            out = env.chunk_step(actions)
            recorder.add(obs, actions[:, 0], out.rewards[:, 0], out.info["success"][:, 0], scene_poses(states),
                         envs=by_expert)
            expert_steps += by_expert
            step += 1
            obs = out.obs
            if "episode" in out.info:
                ep, done = out.info["episode"], out.info["_episode"]
                for i in np.flatnonzero(done):
                    episode = {k: float(ep[k][i]) for k in ep}
                    if by_expert[i]:
                        held_handovers += int(held_at_handover[i])
                        if only_held and not held_at_handover[i]:
                            recorder.discard(i)
                        else:
                            written = recorder.finish(i, instructions[i], int(state_ids[i]),
                                                      {**episode, "handover_step": float(handover[i]),
                                                       "held_at_handover": float(held_at_handover[i])})
                            kept += written
                            frames += int(expert_steps[i]) * written
                            expert_success.append(episode["success_once"])
                    else:  # finished before the hand-over (solved or timed out): nothing recorded
                        policy_success += int(episode["success_once"])
                        recorder.discard(i)
                    episodes += 1
                    bar.update(1)
                    step[i], expert_steps[i], grasped_yet[i], held_at_handover[i] = 0, 0, False, False
                    handover[i] = rng.choice(handover_steps)
                    if grasp_delays:
                        delay[i] = rng.choice(grasp_delays)
                expert.reset(np.flatnonzero(done))
            state_ids = out.info["state_id"]
            bar.set_postfix(kept=kept, held=held_handovers,
                            expert_success=f"{np.mean(expert_success) if expert_success else 0:.2f}")
    finally:
        bar.close()
    return {"episodes": episodes, "kept": kept, "frames_recorded": frames,
            "policy_solved_before_handover": policy_success, "handovers_holding_the_object": held_handovers,
            "expert_success_after_handover": float(np.mean(expert_success)) if expert_success else None,
            "handover_steps": list(handover_steps), "grasp_delays": list(grasp_delays), "only_held": only_held,
            "temperature": temperature, "seed": seed, "demo_folder": str(out_dir)}
