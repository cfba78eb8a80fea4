"""The whole rollout -> targets path (env contract, ``collect_rollout``, ``compute_targets``)
against a plain float64 reference written from the definitions: one env at a time, one
sub-step at a time, no vectorisation.

The env is the toy task under the real ``ChunkVectorEnv``; the policy is a script of actions
with a known value function ``V(obs)``, so the reference can say which observation every value
was taken of. Every ``chunk_reset`` x ``skip_finished_actions`` x ``reward_type`` x
``logprob_type`` combination the config accepts is drawn, with random success / time-limit
patterns.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_env import ToyEnv

from vla_envs.core import ChunkVectorEnv
from vla_envs.core.serial import SerialBackend
from vla_trainer.config.schema import AlgorithmConfig
from vla_trainer.rl.rollout import collect_rollout
from vla_trainer.rl.targets import compute_targets

A = 7  # tokens per action
GAMMA, LAM, EPS = 0.9, 0.8, 1e-6
COMBOS = [("chunk_level", "chunk_level"), ("chunk_level", "action_level"), ("chunk_level", "token_level"),
          ("action_level", "action_level"), ("action_level", "token_level")]


def value_fn(t: float, a0: float) -> float:
    """V of a toy observation (``state = [t, state_id, a0]``): depends on what the reference knows."""
    return 0.37 * float(t) + 1.9 * float(a0) - 0.2


def x_code(chunk: int, sub_step: int, chunk_size: int) -> np.float32:
    """The action's x value: different at every sub-step, so a final observation names its step."""
    return np.float32(((chunk * chunk_size + sub_step) % 13 + 1) / 14)


class ScriptedPolicy:
    """The policy interface (``act``) playing ``triggers`` [T, N, C]; values from ``value_fn``."""

    def __init__(self, triggers: np.ndarray):
        self.triggers, self.t = triggers, 0

    def act(self, obs, temperature=1.0, top_k=None, generator=None, greedy=False):
        state = np.asarray(obs["state"], np.float64)
        values = torch.tensor([[value_fn(s[0], s[2])] for s in state], dtype=torch.float32)
        n, c = len(state), self.triggers.shape[2]
        actions = np.zeros((n, c, 7), np.float32)
        if not greedy:  # a rollout step (greedy calls only ask for values)
            actions[..., 6] = self.triggers[self.t, :n]
            actions[..., 0] = [x_code(self.t, j, c) for j in range(c)]
            self.t += 1
        log_probs = -0.1 * torch.arange(1, c * A + 1, dtype=torch.float32).reshape(1, c, A).expand(n, c, A)
        return SimpleNamespace(actions=torch.from_numpy(actions), action_token_ids=torch.zeros(n, c, A, dtype=torch.long),
                               log_probs=log_probs.clone(), values=values)


@dataclass
class EnvReference:
    """One env of the contract, sub-step by sub-step: what happens, and which observation ends each episode."""

    max_steps: int
    auto_reset: bool
    ignore_terminations: bool
    chunk_reset: str
    skip: bool
    live: bool = True
    t: int = 0
    a0: float = 0.0
    steps: list = field(default_factory=list)  # per chunk: (V_start, [(r, term, trunc, valid)] * C, V_final)

    def restart(self):
        self.live, self.t, self.a0 = True, 0, 0.0

    def chunk(self, k: int, triggers: list[bool]) -> None:
        c = len(triggers)
        v_start, subs, v_final = value_fn(self.t, self.a0), [], 0.0
        in_chunk, finished = self.live, False
        for j, trig in enumerate(triggers):
            if not ((in_chunk or not self.skip) and self.live):
                subs.append((0.0, False, False, in_chunk))
                continue
            valid = in_chunk
            self.t += 1
            self.a0 = float(x_code(k, j, c))
            term = bool(trig) and not self.ignore_terminations
            trunc = self.t >= self.max_steps
            subs.append((1.0 if trig else 0.1, term, trunc, valid))
            if term or trunc:
                if valid:  # the chunk's own episode ended: its final observation is this one
                    v_final = value_fn(self.t, self.a0)
                self.live, in_chunk, finished = False, False, True
                if self.auto_reset and self.chunk_reset == "immediate":
                    self.restart()
        if self.auto_reset and self.chunk_reset == "end_of_chunk" and finished:
            self.restart()
        self.steps.append((v_start, subs, v_final))

    def reward_steps(self, reward_type: str) -> list[dict]:
        """The env's transitions at the reward granularity, in time order (invalid ones included)."""
        out = []
        for k, (v_start, subs, v_final) in enumerate(self.steps):
            if reward_type == "chunk_level":
                valid = [s for s in subs if s[3]]
                out.append({"key": (k,), "r": sum(s[0] for s in valid), "term": any(s[1] for s in valid),
                            "trunc": any(s[2] for s in valid), "valid": bool(valid), "V": v_start,
                            "fv": v_final, "subs": sum(1 for s in subs if s[3])})
            else:
                for j, (r, term, trunc, valid) in enumerate(subs):
                    out.append({"key": (k, j), "r": r if valid else 0.0, "term": term and valid,
                                "trunc": trunc and valid, "valid": valid, "V": v_start, "fv": v_final, "subs": 1})
        return out


def reference_gae(steps: list[dict], next_value: float) -> dict:
    """GAE by its definition; invalid transitions do not exist."""
    adv, next_v, carry = {}, next_value, 0.0
    for s in reversed(steps):
        if not s["valid"]:
            continue
        boot = 0.0 if s["term"] else (s["fv"] if s["trunc"] else next_v)
        delta = s["r"] + GAMMA * boot - s["V"]
        a = delta + GAMMA * LAM * (0.0 if (s["term"] or s["trunc"]) else carry)
        adv[s["key"]] = a
        carry, next_v = a, s["V"]
    return adv


def reference_grpo(envs: list[EnvReference], reward_type: str, logprob_type: str, group_size: int,
                   use_filter: bool) -> tuple[dict, list[float]]:
    """Per env: the steps up to the first done (the valid-action mask), the score, the advantage,
    and 1 / T_i with T_i the valid log-prob entries under that mask."""
    per_env = []
    for e in envs:
        kept, score = [], 0.0
        for s in e.reward_steps(reward_type):
            if not s["valid"]:
                continue
            kept.append(s)
            score += s["r"]
            if s["term"] or s["trunc"]:
                break
        per_env.append((kept, score))
    advs = []
    for g in range(0, len(envs), group_size):
        scores = [sc for _, sc in per_env[g:g + group_size]]
        if max(scores) - min(scores) <= 1e-5 * max(1.0, max(abs(x) for x in scores)):  # equal up to rounding
            advs += [0.0] * group_size
            continue
        mean = sum(scores) / group_size
        std = (sum((x - mean) ** 2 for x in scores) / (group_size - 1)) ** 0.5
        advs += [(x - mean) / (std + EPS) for x in scores]
    entries = {"chunk_level": lambda s: 1, "action_level": lambda s: s["subs"], "token_level": lambda s: A * s["subs"]}
    out = []
    for i, (kept, _) in enumerate(per_env):
        g = i // group_size
        dropped = use_filter and all(a == 0.0 for a in advs[g * group_size:(g + 1) * group_size])
        count = sum(entries[logprob_type](s) for s in kept)
        out.append({"keys": set() if dropped else {s["key"] for s in kept}, "adv": advs[i],
                    "weight": 0.0 if dropped or count == 0 else 1.0 / count})
    return out, advs


def run(n, c, max_steps, mode, triggers):
    env = ChunkVectorEnv(SerialBackend([lambda: ToyEnv(max_steps)] * n), **mode)
    obs, _ = env.reset(seed=0)
    rollout, _ = collect_rollout(env, ScriptedPolicy(triggers), obs, triggers.shape[0])
    refs = [EnvReference(max_steps, mode["auto_reset"], mode["ignore_terminations"], mode["chunk_reset"],
                         mode["skip_finished_actions"]) for _ in range(n)]
    for i, ref in enumerate(refs):
        for k in range(triggers.shape[0]):
            ref.chunk(k, triggers[k, i].tolist())
    return rollout, refs


modes = st.fixed_dictionaries({
    "auto_reset": st.booleans(),
    "ignore_terminations": st.booleans(),
    "chunk_reset": st.sampled_from(["end_of_chunk", "immediate"]),
    "skip_finished_actions": st.booleans(),
})


def _triggers(data, t, n, c):
    p = data.draw(st.sampled_from([0.0, 0.1, 0.3]))  # how often an action succeeds
    bits = data.draw(st.lists(st.floats(0, 1), min_size=t * n * c, max_size=t * n * c))
    return (np.array(bits).reshape(t, n, c) < p)


@settings(max_examples=120, deadline=None)
@given(n=st.integers(1, 3), c=st.integers(1, 4), max_steps=st.integers(1, 7), mode=modes,
       combo=st.sampled_from(COMBOS), data=st.data())
def test_gae_targets_match_the_reference(n, c, max_steps, mode, combo, data):
    reward_type, logprob_type = combo
    t = data.draw(st.integers(1, 5))
    rollout, refs = run(n, c, max_steps, mode, _triggers(data, t, n, c))
    alg = AlgorithmConfig(adv_type="gae", loss_type="actor_critic", reward_type=reward_type,
                          logprob_type=logprob_type, value_type="chunk_level", gamma=GAMMA, gae_lambda=LAM,
                          normalize_advantages=False)
    targets = compute_targets(rollout, alg)
    for i, ref in enumerate(refs):
        steps = ref.reward_steps(reward_type)
        adv = reference_gae(steps, value_fn(ref.t, ref.a0))
        for s in steps:
            got_adv = targets.advantages[(s["key"][0], i) + s["key"][1:]]
            got_ret = targets.returns[(s["key"][0], i) + s["key"][1:]]
            assert bool(targets.mask[(s["key"][0], i) + s["key"][1:]]) == s["valid"]
            want = adv.get(s["key"], 0.0)
            assert float(got_adv) == pytest.approx(want, abs=1e-4), (i, s["key"])
            assert float(got_ret) == pytest.approx(want + s["V"] if s["valid"] else 0.0, abs=1e-4)


@settings(max_examples=120, deadline=None)
@given(groups=st.integers(1, 2), group_size=st.sampled_from([2, 3]), c=st.integers(1, 4),
       max_steps=st.integers(1, 7), mode=modes, combo=st.sampled_from(COMBOS), use_filter=st.booleans(),
       data=st.data())
def test_grpo_targets_match_the_reference(groups, group_size, c, max_steps, mode, combo, use_filter, data):
    reward_type, logprob_type = combo
    n, t = groups * group_size, data.draw(st.integers(1, 5))
    rollout, refs = run(n, c, max_steps, mode, _triggers(data, t, n, c))
    alg = AlgorithmConfig(adv_type="grpo", loss_type="actor", reward_type=reward_type, logprob_type=logprob_type,
                          group_size=group_size, length_normalization=True, success_rate_filter=use_filter)
    targets = compute_targets(rollout, alg, group_size=group_size)
    want, _ = reference_grpo(refs, reward_type, logprob_type, group_size, use_filter)
    unfiltered, _ = reference_grpo(refs, reward_type, logprob_type, group_size, False)
    lp_shape = {"chunk_level": (t, n), "action_level": (t, n, c), "token_level": (t, n, c, A)}[logprob_type]
    assert tuple(targets.weights.shape) == lp_shape
    for i, ref in enumerate(refs):
        w = want[i]
        for s in ref.reward_steps(reward_type):
            key = (s["key"][0], i) + s["key"][1:]
            counted = s["key"] in w["keys"]
            assert bool(targets.mask[key]) == counted, (i, s["key"])
            assert float(targets.advantages[key]) == pytest.approx(w["adv"] if counted else 0.0, abs=1e-5)
        # every trajectory weighs 1 (0 when empty), spread evenly over its valid entries; a filtered one
        # too, since it still counts in the loss's denominator (its entries are out of the mask)
        u = unfiltered[i]
        weights = targets.weights[:, i].reshape(-1)
        nonzero = weights[weights > 0]
        assert float(weights.sum()) == pytest.approx(1.0 if u["weight"] else 0.0, abs=1e-5)
        assert torch.allclose(nonzero, torch.full_like(nonzero, u["weight"]))
        if use_filter:
            for s in ref.reward_steps(reward_type):
                key = (s["key"][0], i) + s["key"][1:]
                assert bool(targets.denominator_mask[key]) == (s["key"] in u["keys"])
        else:
            assert targets.denominator_mask is None


def test_a_second_episode_in_one_chunk_does_not_steal_the_first_ones_bootstrap():
    """One env, chunk 4, time limit 2, immediate reset without skipping: episode 1 is cut at
    sub-step 1 and episode 2 (run on the leftover, invalid sub-steps) at sub-step 3. The first
    episode's truncation bootstraps from its own final observation."""
    mode = {"auto_reset": True, "ignore_terminations": False, "chunk_reset": "immediate",
            "skip_finished_actions": False}
    rollout, refs = run(1, 4, 2, mode, np.zeros((1, 1, 4), bool))
    own = value_fn(2, x_code(0, 1, 4))  # t = 2 after sub-step 1
    assert float(rollout.final_values[0, 0]) == pytest.approx(own, abs=1e-5)
    assert float(rollout.final_values[0, 0]) != pytest.approx(value_fn(2, x_code(0, 3, 4)), abs=1e-3)
    assert rollout.episodes["length"] == [2, 2]  # both episodes counted, none overwritten


def test_all_equal_scores_give_exactly_zero_advantage_and_count_as_filtered():
    """Eight trajectories scoring 0.7 each (float32 rounding of the mean used to survive the eps)."""
    from vla_trainer.algorithms import group_advantages

    for value in (0.7, 1.2, 0.1):
        scores = torch.full((8,), value, dtype=torch.float32)
        assert torch.equal(group_advantages(scores, 8), torch.zeros(8))


def test_the_rollout_reads_final_observations_by_the_declared_autoreset_mode():
    from gymnasium.vector import AutoresetMode

    env = ChunkVectorEnv(SerialBackend([lambda: ToyEnv(2)]), auto_reset=False)
    obs, _ = env.reset(seed=0)
    # without auto-reset a finished env keeps its final observation: V is taken of out.obs
    rollout, _ = collect_rollout(env, ScriptedPolicy(np.zeros((1, 1, 3), bool)), obs, 1)
    assert float(rollout.final_values[0, 0]) == pytest.approx(value_fn(2, x_code(0, 1, 3)), abs=1e-5)
    env.metadata = {**env.metadata, "autoreset_mode": AutoresetMode.NEXT_STEP}
    with pytest.raises(ValueError, match="autoreset_mode.*SAME_STEP.*DISABLED"):
        collect_rollout(env, ScriptedPolicy(np.zeros((1, 1, 3), bool)), obs, 1)
