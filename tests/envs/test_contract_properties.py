"""Property tests: random done patterns, chunk sizes and modes against a scalar per-env
model of the contract (written independently of the vectorized implementation)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from toy_env import ToyEnv

from vla_envs.core import ChunkVectorEnv
from vla_envs.core.serial import SerialBackend


@dataclass
class EnvModel:
    """One env under the contract's rules, one sub-step at a time."""

    max_steps: int
    live: bool = True
    t: int = 0
    ret: float = 0.0
    success_once: bool = False
    last_success: bool = False
    episodes: list = field(default_factory=list)

    def restart(self):
        self.live, self.t, self.ret, self.success_once, self.last_success = True, 0, 0.0, False, False

    def chunk(self, triggers, auto_reset, ignore_term, chunk_reset, skip):
        c = len(triggers)
        rew, term, trunc, valid = np.zeros(c, np.float32), np.zeros(c, bool), np.zeros(c, bool), np.zeros(c, bool)
        in_chunk, finished, ended = self.live, False, []  # every episode ending in the chunk, in order
        for j, trig in enumerate(triggers):
            valid[j] = in_chunk
            active = in_chunk if skip else True
            if not (active and self.live):
                continue
            self.t += 1
            r = 1.0 if trig else 0.1
            self.ret += r
            self.success_once |= trig
            self.last_success = trig
            rew[j], term[j], trunc[j] = r, trig and not ignore_term, self.t >= self.max_steps
            if term[j] or trunc[j]:
                ended.append(((self.success_once, self.last_success, self.ret, self.t), j))
                self.live, in_chunk, finished = False, False, True
                if auto_reset and chunk_reset == "immediate":
                    self.restart()
        if auto_reset and chunk_reset == "end_of_chunk" and finished:
            self.restart()
        return rew, term, trunc, valid, ended


modes = st.fixed_dictionaries({
    "auto_reset": st.booleans(),
    "ignore_terminations": st.booleans(),
    "chunk_reset": st.sampled_from(["end_of_chunk", "immediate"]),
    "skip_finished_actions": st.booleans(),
})


@settings(max_examples=150, deadline=None)
@given(n=st.integers(1, 4), c=st.integers(1, 5), max_steps=st.integers(1, 7), mode=modes,
       data=st.data())
def test_chunk_step_matches_per_env_model(n, c, max_steps, mode, data):
    env = ChunkVectorEnv(SerialBackend([lambda: ToyEnv(max_steps)] * n), **mode)
    env.reset(seed=0)
    models = [EnvModel(max_steps) for _ in range(n)]
    n_chunks = data.draw(st.integers(1, 6))
    for _ in range(n_chunks):
        triggers = np.array(data.draw(st.lists(st.lists(st.booleans(), min_size=c, max_size=c),
                                               min_size=n, max_size=n)))
        a = np.zeros((n, c, 7), np.float32)
        a[..., 6] = triggers
        out = env.chunk_step(a)
        for i, m in enumerate(models):
            rew, term, trunc, valid, ended = m.chunk(
                triggers[i].tolist(), mode["auto_reset"], mode["ignore_terminations"],
                mode["chunk_reset"], mode["skip_finished_actions"])
            np.testing.assert_allclose(out.rewards[i], rew, rtol=1e-6)
            assert out.terminated[i].tolist() == term.tolist()
            assert out.truncated[i].tolist() == trunc.tolist()
            assert out.valid[i].tolist() == valid.tolist()
            assert int(out.obs["state"][i, 0]) == m.t
            # valid is a prefix: once an env finished in a chunk, the rest is invalid
            assert not np.any(np.diff(out.valid[i].astype(int)) > 0)
            later = [r for r in out.info.get("later_episodes", []) if r["env"] == i]
            if not ended:
                assert not out.info.get("_episode", np.zeros(n, bool))[i] and not later
            else:
                # the first episode of the chunk in info["episode"] / final_obs, each later one in
                # info["later_episodes"]: none is lost or overwritten
                ep = out.info["episode"]
                assert out.info["_episode"][i]
                reported = [({k: v[i] for k, v in ep.items()},
                             out.info["final_obs"]["state"][i] if mode["auto_reset"] else None)]
                reported += [(r["episode"], r["final_obs"]["state"]) for r in later]
                assert [r["sub_step"] for r in later] == [j for _, j in ended[1:]]
                assert len(reported) == len(ended)
                for (metrics, final_state), (episode, _) in zip(reported, ended):
                    got = (bool(metrics["success_once"]), bool(metrics["success_at_end"]),
                           float(metrics["return"]), int(metrics["length"]))
                    assert got[:2] == episode[:2] and got[3] == episode[3]
                    assert abs(got[2] - episode[2]) < 1e-5
                    if final_state is not None:
                        assert int(final_state[0]) == episode[3]  # the final obs is that episode's own
                if mode["auto_reset"]:
                    assert out.info["_final_obs"][i]
        if mode["ignore_terminations"]:
            assert not out.terminated.any()
