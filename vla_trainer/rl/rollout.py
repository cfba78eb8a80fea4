"""Collecting a rollout: ``T`` chunk steps of ``N`` envs with the policy that is being trained.

Read top to bottom: ``collect_rollout`` alternates generation (``policy.act`` on the current
observations) and simulation (``env.chunk_step``), writing per chunk into a ``RolloutBuffer``
(preallocated ``[T, N, ...]``; the Ray runtime's driver fills the same buffer) what the update needs:
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
from vla_trainer.rl.evaluation import crashed_now


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

    def reward_per_step(self) -> float:
        """Mean reward of the valid sub-steps (an invalid one's reward, under ``chunk_reset="immediate"``
        the next episode's, is no step of the episode the chunk was planned for)."""
        return float((self.rewards * self.valid).sum() / self.valid.sum().clamp(min=1))

    def obs(self, t: np.ndarray, n: np.ndarray) -> dict:
        """Observation dict of samples ``(t[k], n[k])`` (what ``policy.prepare`` takes)."""
        obs = {"image": self.image[t, n], "instruction": tuple(self.instruction[i][j] for i, j in zip(t, n))}
        if self.state is not None:
            obs["state"] = self.state[t, n]
        return obs


class RolloutBuffer:
    """One rollout's storage, written in place: every field ``[T, N, ...]`` (the shapes of the module
    docstring), allocated once, at its first write, from that write's shape and dtype. ``rows``
    selects the envs a write covers: all of them in one process, one worker's slice on Ray, so both
    runtimes fill the same buffer and build the same ``Rollout``."""

    TORCH_FIELDS = ("action_token_ids", "log_probs", "values", "final_values", "rewards", "terminated",
                    "truncated", "valid")
    NUMPY_FIELDS = ("image", "state")

    def __init__(self, num_chunks: int, num_envs: int):
        self.num_chunks, self.num_envs = num_chunks, num_envs
        self.fields: dict[str, np.ndarray | torch.Tensor] = {}
        self.absent: set[str] = set()  # optional fields (state, values) some write did not have
        self.instruction = [[""] * num_envs for _ in range(num_chunks)]
        self.episodes: dict[str, list[float]] = defaultdict(list)

    def write(self, t: int, rows: slice, *, instruction, episodes: dict[str, list[float]] | None = None,
              **values) -> None:
        """Store chunk ``t`` of envs ``rows``: ``instruction`` (their strings), the episodes that
        finished, and any of ``TORCH_FIELDS`` / ``NUMPY_FIELDS`` (``None``: the field is absent)."""
        self.instruction[t][rows] = list(instruction)
        for key, vals in (episodes or {}).items():
            self.episodes[key].extend(vals)
        for name, value in values.items():
            if name not in self.TORCH_FIELDS + self.NUMPY_FIELDS:
                raise KeyError(f"RolloutBuffer has no field {name!r}")
            if value is None:
                self.absent.add(name)
                continue
            store = self.fields.get(name)
            if store is None:
                shape = (self.num_chunks, self.num_envs, *value.shape[1:])
                store = (np.zeros(shape, dtype=value.dtype) if name in self.NUMPY_FIELDS
                         else torch.zeros(shape, dtype=value.dtype))
                self.fields[name] = store
            store[t, rows] = value

    def rollout(self, next_values: torch.Tensor, timing: dict[str, float]) -> Rollout:
        """The filled buffer as a ``Rollout``."""
        get = lambda name: None if name in self.absent else self.fields[name]  # noqa: E731
        return Rollout(image=self.fields["image"], instruction=self.instruction, state=get("state"),
                       action_token_ids=self.fields["action_token_ids"], log_probs=self.fields["log_probs"],
                       values=get("values"), final_values=self.fields["final_values"], next_values=next_values,
                       rewards=self.fields["rewards"], terminated=self.fields["terminated"],
                       truncated=self.fields["truncated"], valid=self.fields["valid"],
                       episodes=dict(self.episodes), timing=timing)


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


CRASHED_EPISODES = "crashed_episodes"
"""``finished_episodes``' key for episodes cut by their simulator's crash: one 1.0 each. Their metrics
are left out: a crash is no failure of the policy (as in evaluation)."""


LATE_EPISODES = "late_episodes"
"""``finished_episodes``' key for episodes that started too late in the rollout to reach the time
limit before its end: one 1.0 each. Their metrics are left out: such an episode finished only by
succeeding early, so counting it would count the successes among late starts and not the failures."""


def finished_episodes(out, first_step: int, horizon: int, time_limit: int) -> dict[str, list[float]]:
    """Metrics of the episodes that finished in one chunk step ``out``: each env's first
    (``info["episode"]``) and any later ones (``info["later_episodes"]``), except those a simulator
    crash cut (counted under ``CRASHED_EPISODES``) and those that started after
    ``horizon - time_limit`` (``LATE_EPISODES``): an episode is counted when it would have finished
    within the rollout whatever it did, so the success rate over the counted ones is the policy's.

    Args:
        out: the chunk step's result (``info``, and ``terminated`` / ``truncated`` / ``valid``
            ``[N, C]``, which place each first episode's end).
        first_step: the rollout's sub-steps before this chunk (since its reset).
        horizon: the rollout's sub-steps in all.
        time_limit: the env's ``max_episode_steps``.
    """
    info = out.info
    metrics: dict[str, list[float]] = defaultdict(list)
    crashed = late = 0
    last_start = horizon - time_limit
    if "episode" in info:
        lost = info["_episode"] & crashed_now(info)
        ended = (np.asarray(out.terminated) | np.asarray(out.truncated)) & np.asarray(out.valid)
        start = first_step + ended.argmax(axis=1) - np.asarray(info["episode"]["length"]) + 1
        too_late = info["_episode"] & ~lost & (start > last_start)
        kept = info["_episode"] & ~lost & ~too_late
        crashed += int(lost.sum())
        late += int(too_late.sum())
        for key, arr in info["episode"].items():
            metrics[key].extend(np.asarray(arr)[kept].astype(float).tolist())
    for record in info.get("later_episodes", ()):
        if record.get("truncation_reason") == "worker_crashed":
            crashed += 1
            continue
        if first_step + record["sub_step"] - record["episode"]["length"] + 1 > last_start:
            late += 1
            continue
        for key, value in record["episode"].items():
            metrics[key].append(float(value))
    if crashed:
        metrics[CRASHED_EPISODES] = [1.0] * crashed
    if late:
        metrics[LATE_EPISODES] = [1.0] * late
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
    n = env.num_envs
    buffer, every = RolloutBuffer(num_chunks, n), slice(None)
    timing = {"generation": 0.0, "simulation": 0.0}
    mode = autoreset_mode(env)
    for t in range(num_chunks):
        t0 = time.perf_counter()
        sample = policy.act(obs, temperature=temperature, top_k=top_k, generator=generator)
        t1 = time.perf_counter()
        out = env.chunk_step(sample.actions.cpu().numpy())
        t2 = time.perf_counter()
        timing["generation"] += t1 - t0
        timing["simulation"] += t2 - t1

        # bootstrap values of time-limit truncations: V(observation where the episode was cut)
        final_values = torch.zeros(n)
        cut, finals = truncated_finals(out, mode)
        if cut.size and sample.values is not None:
            t3 = time.perf_counter()
            final_values[cut] = values_of(policy, finals, temperature, top_k).cpu()
            timing["generation"] += time.perf_counter() - t3

        buffer.write(
            t, every, instruction=obs["instruction"],
            episodes=finished_episodes(out, t * out.rewards.shape[1], num_chunks * out.rewards.shape[1],
                                       env.max_episode_steps),
            image=np.asarray(obs["image"]),
            state=np.asarray(obs["state"], dtype=np.float32) if "state" in obs else None,
            action_token_ids=sample.action_token_ids.cpu(), log_probs=sample.log_probs.float().cpu(),
            values=None if sample.values is None else sample.values.float().cpu(), final_values=final_values,
            rewards=torch.as_tensor(out.rewards, dtype=torch.float32) * reward_coef,
            terminated=torch.as_tensor(out.terminated), truncated=torch.as_tensor(out.truncated),
            valid=torch.as_tensor(out.valid))
        obs = out.obs

    t0 = time.perf_counter()
    next_values = values_of(policy, obs, temperature, top_k) if "values" not in buffer.absent else None
    timing["generation"] += time.perf_counter() - t0
    return buffer.rollout(torch.zeros(n) if next_values is None else next_values.cpu(), timing), obs


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
