"""Collecting a rollout: ``T`` chunk steps of ``N`` envs with the policy that is being trained.

Read top to bottom: ``collect_rollout`` alternates generation (``policy.act`` on the current
observations) and simulation (``env.chunk_step``), storing per chunk what the update needs:
the raw observation (images uint8, instructions; model inputs are rebuilt per minibatch, which
is cheaper to keep than float pixel tensors), the sampled action tokens, their log-probs and the
critic's values *at rollout time* (never recomputed for the old policy), and the env's
per-sub-step rewards / flags / validity. Truncated episodes get ``V(final observation)`` for
bootstrapping, computed in one extra forward pass over just those envs.

Shapes (T chunks, N envs, C actions per chunk, A = 7 tokens per action, V = 1 or C values):
    image [T, N, H, W, 3] uint8      instruction: T lists of N strings
    state [T, N, S] float32 robot state (None when the env reports none)
    action_token_ids, log_probs [T, N, C, A]
    values [T, N, V]                 final_values [T, N] (0 where not truncated)
    rewards, terminated, truncated, valid [T, N, C]
    next_values [N]                  V(observation after the last chunk)
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
import torch
from gymnasium.vector import AutoresetMode

from vla_trainer.models import VLAPolicy


@dataclass
class Rollout:
    image: np.ndarray
    instruction: list[list[str]]
    action_token_ids: torch.Tensor
    log_probs: torch.Tensor
    values: torch.Tensor | None
    final_values: torch.Tensor
    next_values: torch.Tensor
    rewards: torch.Tensor
    terminated: torch.Tensor
    truncated: torch.Tensor
    valid: torch.Tensor
    state: np.ndarray | None = None
    episodes: dict[str, list[float]] = field(default_factory=dict)
    """Metrics of the episodes that finished during the rollout (success_once, success_at_end, ...)."""
    timing: dict[str, float] = field(default_factory=dict)
    """Seconds spent in generation (policy) and simulation (env)."""

    @property
    def num_chunks(self) -> int:
        return self.action_token_ids.shape[0]

    @property
    def num_envs(self) -> int:
        return self.action_token_ids.shape[1]

    def obs(self, t: np.ndarray, n: np.ndarray) -> dict:
        """Observation dict of samples ``(t[k], n[k])`` (what ``policy.prepare`` takes)."""
        obs = {"image": self.image[t, n], "instruction": tuple(self.instruction[i][j] for i, j in zip(t, n))}
        if self.state is not None:
            obs["state"] = self.state[t, n]
        return obs


def obs_rows(obs: dict, rows: np.ndarray) -> dict:
    """The observation of envs ``rows`` only (image, instruction and, if present, state)."""
    sub = {"image": np.asarray(obs["image"])[rows], "instruction": tuple(obs["instruction"][i] for i in rows)}
    if "state" in obs:
        sub["state"] = np.asarray(obs["state"])[rows]
    return sub


def autoreset_mode(env) -> AutoresetMode:
    """The env's declared autoreset mode; the trainer reads final observations by it.

    Raises:
        ValueError: the env declares no ``metadata["autoreset_mode"]``, or NEXT_STEP (whose
            step after a done is a reset step, which the rollout does not skip).
    """
    mode = getattr(env, "metadata", {}).get("autoreset_mode")
    if mode not in (AutoresetMode.SAME_STEP, AutoresetMode.DISABLED):
        raise ValueError(f"the trainer needs a vector env whose metadata['autoreset_mode'] is SAME_STEP "
                         f"(final observations in info['final_obs']) or DISABLED, got {mode!r}")
    return mode


def truncated_finals(out, mode: AutoresetMode) -> tuple[np.ndarray, dict | None]:
    """Envs whose chunk's own episode hit the time limit (a valid, truncated and not terminated
    sub-step) and that episode's final observation, the one to bootstrap from.

    Episodes an env finished later in the same chunk (``info["later_episodes"]``) ran only on
    invalid sub-steps, which GAE skips, so they need no bootstrap value.

    Shapes:
        out.truncated, out.terminated, out.valid: ``[N, C]``. Returns ``[m]`` env indices and
        the observation of those ``m`` envs (None when ``m == 0``).
    """
    cut = np.flatnonzero((out.truncated & ~out.terminated & out.valid).any(axis=1))
    if not cut.size:
        return cut, None
    source = out.info["final_obs"] if mode == AutoresetMode.SAME_STEP else out.obs
    return cut, obs_rows(source, cut)


def finished_episodes(info: dict) -> dict[str, list[float]]:
    """Metrics of every episode that finished in one chunk step: each env's first
    (``info["episode"]``) and any later ones (``info["later_episodes"]``)."""
    metrics: dict[str, list[float]] = defaultdict(list)
    if "episode" in info:
        done = info["_episode"]
        for key, arr in info["episode"].items():
            metrics[key].extend(np.asarray(arr)[done].astype(float).tolist())
    for record in info.get("later_episodes", ()):
        for key, value in record["episode"].items():
            metrics[key].append(float(value))
    return dict(metrics)


def first_value(values: torch.Tensor | None) -> torch.Tensor | None:
    """The critic's estimate of the state at the start of a chunk: ``[N, V]`` -> ``[N]``."""
    return None if values is None else values[:, 0].float()


@torch.no_grad()
def values_of(policy: VLAPolicy, obs: dict, temperature: float, top_k: int | None) -> torch.Tensor | None:
    """``V(obs)`` ``[N]`` (greedy, so no random numbers are drawn; the action is discarded)."""
    return first_value(policy.act(obs, temperature=temperature, top_k=top_k, greedy=True).values)


@torch.no_grad()
def collect_rollout(env, policy: VLAPolicy, obs: dict, num_chunks: int, *, temperature: float = 1.0,
                    top_k: int | None = None, generator: torch.Generator | None = None,
                    reward_coef: float = 1.0) -> tuple[Rollout, dict]:
    """Runs ``num_chunks`` chunk steps from ``obs``; returns the rollout and the last observation."""
    images, states, instructions, tokens, log_probs, values, final_values = [], [], [], [], [], [], []
    rewards, terminated, truncated, valid = [], [], [], []
    episodes: dict[str, list[float]] = defaultdict(list)
    timing = {"generation": 0.0, "simulation": 0.0}
    n = env.num_envs
    mode = autoreset_mode(env)
    for _ in range(num_chunks):
        t0 = time.perf_counter()
        sample = policy.act(obs, temperature=temperature, top_k=top_k, generator=generator)
        t1 = time.perf_counter()
        out = env.chunk_step(sample.actions.cpu().numpy())
        t2 = time.perf_counter()
        timing["generation"] += t1 - t0
        timing["simulation"] += t2 - t1

        images.append(np.asarray(obs["image"]))
        states.append(np.asarray(obs["state"], dtype=np.float32) if "state" in obs else None)
        instructions.append(list(obs["instruction"]))
        tokens.append(sample.action_token_ids.cpu())
        log_probs.append(sample.log_probs.float().cpu())
        values.append(None if sample.values is None else sample.values.float().cpu())
        rewards.append(torch.as_tensor(out.rewards, dtype=torch.float32) * reward_coef)
        terminated.append(torch.as_tensor(out.terminated))
        truncated.append(torch.as_tensor(out.truncated))
        valid.append(torch.as_tensor(out.valid))

        # bootstrap values of time-limit truncations: V(observation where the episode was cut)
        fv = torch.zeros(n)
        cut, finals = truncated_finals(out, mode)
        if cut.size and sample.values is not None:
            t3 = time.perf_counter()
            fv[cut] = values_of(policy, finals, temperature, top_k).cpu()
            timing["generation"] += time.perf_counter() - t3
        final_values.append(fv)

        for key, vals in finished_episodes(out.info).items():
            episodes[key].extend(vals)
        obs = out.obs

    t0 = time.perf_counter()
    next_values = values_of(policy, obs, temperature, top_k) if values[0] is not None else None
    timing["generation"] += time.perf_counter() - t0
    rollout = Rollout(
        image=np.stack(images),
        instruction=instructions,
        action_token_ids=torch.stack(tokens),
        log_probs=torch.stack(log_probs),
        values=None if values[0] is None else torch.stack(values),
        final_values=torch.stack(final_values),
        next_values=torch.zeros(n) if next_values is None else next_values.cpu(),
        rewards=torch.stack(rewards),
        terminated=torch.stack(terminated),
        truncated=torch.stack(truncated),
        valid=torch.stack(valid),
        state=None if any(x is None for x in states) else np.stack(states),
        episodes=dict(episodes),
        timing=timing,
    )
    return rollout, obs


def concat_rollouts(rollouts: list[Rollout]) -> Rollout:
    """Rollouts of the same length side by side, as one rollout of ``sum(N_k)`` envs."""
    if len(rollouts) == 1:
        return rollouts[0]
    cat = lambda name: torch.cat([getattr(r, name) for r in rollouts], dim=1)  # noqa: E731
    episodes: dict[str, list[float]] = defaultdict(list)
    timing: dict[str, float] = defaultdict(float)
    for r in rollouts:
        for k, v in r.episodes.items():
            episodes[k].extend(v)
        for k, v in r.timing.items():
            timing[k] += v
    return Rollout(
        image=np.concatenate([r.image for r in rollouts], axis=1),
        instruction=[sum((r.instruction[t] for r in rollouts), []) for t in range(rollouts[0].num_chunks)],
        action_token_ids=cat("action_token_ids"), log_probs=cat("log_probs"),
        values=None if rollouts[0].values is None else cat("values"),
        final_values=cat("final_values"), next_values=torch.cat([r.next_values for r in rollouts]),
        rewards=cat("rewards"), terminated=cat("terminated"), truncated=cat("truncated"), valid=cat("valid"),
        state=(None if any(r.state is None for r in rollouts)
               else np.concatenate([r.state for r in rollouts], axis=1)),
        episodes=dict(episodes), timing=dict(timing))
