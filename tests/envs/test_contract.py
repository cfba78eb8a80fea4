"""Semantics of ChunkVectorEnv on the deterministic ToyEnv (see toy_env.py).

ToyEnv: success/termination where the action's gripper dim > 0.5, reward 1.0 then, else 0.1;
``state = [t, state_id, a0]``; image filled with ``(state_id + t) % 256``.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode
from toy_env import ToyEnv

from vla_envs.core import ChunkVectorEnv
from vla_envs.core.serial import SerialBackend
from vla_envs.errors import ClosedEnvError

N, A = 4, 7


def make(n=N, max_steps=10, **kw) -> ChunkVectorEnv:
    return ChunkVectorEnv(SerialBackend([lambda: ToyEnv(max_steps)] * n), **kw)


def actions(c=1, succeed: dict[tuple[int, int], bool] | None = None, n=N) -> np.ndarray:
    """Zero actions [n, c, 7]; succeed[(env, sub_step)] sets the gripper dim to 1."""
    a = np.zeros((n, c, A), np.float32)
    for (i, j) in (succeed or {}):
        a[i, j, 6] = 1.0
    return a


def t_of(obs) -> np.ndarray:
    return obs["state"][:, 0].astype(int)


def test_reset_obs_follow_documented_dict_and_space():
    env = make()
    obs, info = env.reset(seed=0)
    assert set(obs) == {"image", "state", "instruction"}
    assert obs["image"].dtype == np.uint8 and obs["image"].shape == (N, 4, 4, 3)
    assert obs["state"].dtype == np.float32 and obs["state"].shape == (N, 3)
    assert isinstance(obs["instruction"], tuple) and len(obs["instruction"]) == N
    assert env.observation_space.contains(obs)
    assert info["state_id"].shape == (N,)
    assert obs["instruction"][0] == f"count from {info['state_id'][0]}"
    assert env.metadata["autoreset_mode"] == AutoresetMode.SAME_STEP
    assert make(auto_reset=False).metadata["autoreset_mode"] == AutoresetMode.DISABLED


def test_step_auto_reset_keeps_final_obs_and_resets_only_finished_env():
    env = make()
    env.reset(seed=0)
    env.step(actions()[:, 0])
    obs, rew, term, trunc, info = env.step(actions(succeed={(2, 0): True})[:, 0])
    assert term.tolist() == [False, False, True, False] and not trunc.any()
    assert rew.tolist() == pytest.approx([0.1, 0.1, 1.0, 0.1])
    assert t_of(obs).tolist() == [2, 2, 0, 2]  # env 2 already reset (SAME_STEP)
    assert info["_final_obs"].tolist() == [False, False, True, False]
    assert info["final_obs"]["state"][2, 0] == 2  # its terminal observation
    assert info["final_info"]["success"][2]
    ep = info["episode"]
    assert set(ep) == {"success_once", "success_at_end", "return", "length"}
    assert info["_episode"].tolist() == [False, False, True, False]
    assert ep["length"][2] == 2 and ep["return"][2] == pytest.approx(1.1)
    assert ep["success_once"][2] and ep["success_at_end"][2]


def test_truncation_at_time_limit_and_ignore_terminations_reports_success_at_end():
    env = make(max_steps=3, ignore_terminations=True)
    env.reset(seed=1)
    # succeed at step 1 only: the episode goes on to the time limit.
    out = env.chunk_step(actions(3, succeed={(0, 0): True}))
    assert not out.terminated.any()
    assert out.truncated[:, 2].all() and not out.truncated[:, :2].any()
    assert out.valid.all()
    ep = out.info["episode"]
    assert ep["success_once"].tolist() == [True, False, False, False]
    assert ep["success_at_end"].tolist() == [False] * N
    assert (ep["length"] == 3).all()
    # succeed at the last step: success_at_end
    out = env.chunk_step(actions(3, succeed={(1, 2): True}))
    assert out.info["episode"]["success_at_end"].tolist() == [False, True, False, False]


@pytest.mark.parametrize("chunk_reset", ["end_of_chunk", "immediate"])
def test_chunk_valid_mask_and_skipping(chunk_reset):
    env = make(chunk_reset=chunk_reset)
    env.reset(seed=0)
    out = env.chunk_step(actions(4, succeed={(1, 1): True, (3, 3): True}))
    assert out.valid.tolist() == [[True] * 4, [True, True, False, False], [True] * 4, [True] * 4]
    assert out.rewards[1].tolist() == pytest.approx([0.1, 1.0, 0.0, 0.0])
    assert out.terminated[1].tolist() == [False, True, False, False]
    # skipped remaining actions: env 1 starts its new episode at t=0 after the chunk.
    assert t_of(out.obs).tolist() == [4, 0, 4, 0]
    assert out.info["final_obs"]["state"][1, 0] == 2
    assert out.info["episode"]["length"].tolist() == [0, 2, 0, 4]


def test_immediate_reset_without_skipping_runs_tail_in_new_episode():
    env = make(chunk_reset="immediate", skip_finished_actions=False)
    env.reset(seed=0)
    out = env.chunk_step(actions(4, succeed={(1, 0): True}))
    assert out.valid[1].tolist() == [True, False, False, False]
    # the 3 remaining actions were executed in the new episode (reported, not valid)
    assert t_of(out.obs)[1] == 3
    assert out.rewards[1].tolist() == pytest.approx([1.0, 0.1, 0.1, 0.1])
    assert out.info["final_obs"]["state"][1, 0] == 1
    out = env.chunk_step(actions(1, succeed={(1, 0): True}))
    assert out.info["episode"]["length"][1] == 4 and out.info["episode"]["return"][1] == pytest.approx(1.3)


def test_end_of_chunk_without_skipping_discards_tail_of_finished_episode():
    env = make(chunk_reset="end_of_chunk", skip_finished_actions=False)
    env.reset(seed=0)
    out = env.chunk_step(actions(4, succeed={(1, 0): True, (1, 2): True}))
    assert out.rewards[1].tolist() == pytest.approx([1.0, 0.0, 0.0, 0.0])
    assert not out.terminated[1, 1:].any()
    assert out.info["final_obs"]["state"][1, 0] == 1  # terminal obs, not the tail's
    assert t_of(out.obs)[1] == 0
    assert out.info["episode"]["length"][1] == 1


def test_without_auto_reset_finished_env_stays_finished_until_reset():
    env = make(auto_reset=False)
    obs0, info0 = env.reset(seed=0)
    out = env.chunk_step(actions(2, succeed={(0, 0): True}))
    assert "final_obs" not in out.info and out.info["_episode"].tolist() == [True, False, False, False]
    assert t_of(out.obs)[0] == 1  # frozen at its terminal observation
    out = env.chunk_step(actions(2))
    assert not out.valid[0].any() and (out.rewards[0] == 0).all() and "episode" not in out.info
    assert t_of(out.obs).tolist() == [1, 4, 4, 4]
    obs, info = env.reset(options={"reset_mask": np.array([True, False, False, False])})
    assert t_of(obs).tolist() == [0, 4, 4, 4]
    assert (info["state_id"][1:] == info0["state_id"][1:]).all()
    assert env.chunk_step(actions(1)).valid.all()


def test_fixed_reset_state_ids_are_shared_by_groups_across_partial_resets():
    env = make(n=6, use_fixed_reset_state_ids=True, group_size=3)
    _, info = env.reset(seed=3)
    ids = info["state_id"]
    assert ids[0] == ids[1] == ids[2] and ids[3] == ids[4] == ids[5] and ids[0] != ids[3]
    # env 0 finishes first; env 1 later: both start their 2nd episode from the same id.
    out = env.chunk_step(actions(2, succeed={(0, 0): True}, n=6))
    second = out.info["state_id"][0]
    assert second != ids[0]
    out = env.chunk_step(actions(2, succeed={(1, 1): True}, n=6))
    assert out.info["state_id"][1] == second and out.info["state_id"][2] == ids[2]
    # seeded: the same seed gives the same ids
    _, again = make(n=6, use_fixed_reset_state_ids=True, group_size=3).reset(seed=3)
    assert again["state_id"].tolist() == ids.tolist()


def test_explicit_state_ids_pin_initial_states_of_reset_envs():
    env = make()
    pinned = np.array([5, -1, 7, -1])
    obs, info = env.reset(seed=0, options={"state_ids": pinned})
    assert info["state_id"][0] == 5 and info["state_id"][2] == 7
    assert obs["state"][:, 1][[0, 2]].tolist() == [5, 7]
    obs, info = env.reset(options={"reset_mask": np.array([False, True, False, False]),
                                   "state_ids": np.array([-1, 42, -1, -1])})
    assert info["state_id"].tolist()[:3] == [5, 42, 7]


def test_deterministic_for_a_seed():
    def run(seed):
        env = make(use_fixed_reset_state_ids=True, group_size=2)
        obs, _ = env.reset(seed=seed)
        rng = np.random.default_rng(0)
        trace = [obs["image"].copy()]
        for _ in range(5):
            a = rng.uniform(-1, 1, (N, 3, A)).astype(np.float32)
            out = env.chunk_step(a)
            trace += [out.obs["image"].copy(), out.rewards.copy(), out.info["state_id"].copy()]
        return trace

    a, b, c = run(7), run(7), run(8)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))


def test_gym_make_and_make_vec_return_the_contract(tmp_path):
    import vla_envs  # noqa: F401
    from vla_envs.registry import TASKS, TaskSpec, register_all

    TASKS["vla/Toy-v0"] = TaskSpec("vla/Toy-v0", "toy", "tests", 10, "toy_env:make_toy_vector_env")
    register_all()
    env = gym.make("vla/Toy-v0", num_envs=3, group_size=3, use_fixed_reset_state_ids=True)
    assert isinstance(env, ChunkVectorEnv) and env.num_envs == 3 and env.spec.id == "vla/Toy-v0"
    venv = gym.make_vec("vla/Toy-v0", num_envs=2)
    assert isinstance(venv, ChunkVectorEnv) and venv.num_envs == 2
    assert isinstance(gym.make("vla_envs:vla/Toy-v0"), ChunkVectorEnv)


# --------------------------------------------------------------------- bad input
@pytest.mark.parametrize(
    "bad, err, text",
    [
        (np.zeros((N, 6), np.float32), ValueError, "shape"),
        (np.zeros((N - 1, 7), np.float32), ValueError, "shape"),
        (np.zeros((N, 7), bool), TypeError, "real-valued"),
        (np.array([["a"] * 7] * N), TypeError, "real-valued"),
        (np.full((N, 7), np.nan, np.float32), ValueError, "NaN or inf for env(s) [0, 1, 2, 3]"),
    ],
)
def test_bad_actions_are_rejected_with_a_clear_error(bad, err, text):
    env = make()
    env.reset(seed=0)
    with pytest.raises(err, match=text.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        env.step(bad)
    env.step(np.zeros((N, 7), np.float32))  # the env is still usable


def test_inf_in_one_env_names_that_env():
    env = make()
    env.reset(seed=0)
    a = actions(3)
    a[2, 1, 0] = np.inf
    with pytest.raises(ValueError, match=r"env\(s\) \[2\]"):
        env.chunk_step(a)


def test_out_of_range_actions_clip_by_default_or_raise():
    env = make()
    env.reset(seed=0)
    a = np.zeros((N, 7), np.float32)
    a[:, 0] = 3.0
    obs, *_ = env.step(a)
    assert (obs["state"][:, 2] == 1.0).all()  # ToyEnv echoes a0: it was clipped
    strict = make(action_out_of_range="raise")
    strict.reset(seed=0)
    with pytest.raises(ValueError, match="outside"):
        strict.step(a)


@pytest.mark.parametrize("option, value", [("auto_reset", "false"), ("ignore_terminations", "false"),
                                           ("use_fixed_reset_state_ids", "no"), ("skip_finished_actions", 0),
                                           ("time_limit", True)])
def test_a_true_or_false_option_given_anything_else_is_refused(option, value):
    """From YAML or --env-kwargs a quoted "false" is a string, which bool() reads as True: it turned
    ignore_terminations (or GRPO's fixed reset states) on."""
    with pytest.raises(ValueError, match=f"{option}={value!r}"):
        make(**{option: value})


def test_misuse_errors():
    env = make()
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0, 1, 2, 3\] were never reset; call reset\(\) first"):
        env.step(np.zeros((N, 7)))
    with pytest.raises(ValueError, match="allowed"):
        env.reset(options={"env_ids": [0]})
    with pytest.raises(ValueError, match="bool with shape"):
        env.reset(options={"reset_mask": np.array([1, 0, 0, 0])})
    with pytest.raises(ValueError, match="selects no env"):
        env.reset(options={"reset_mask": np.zeros(N, bool)})
    with pytest.raises(ValueError, match=r"out of range for env\(s\) \[1\]"):
        env.reset(options={"state_ids": np.array([0, 1000, 0, 0])})
    with pytest.raises(TypeError, match="seed"):
        env.reset(seed=[1, 2, 3, 4])
    with pytest.raises(ValueError, match="group_size"):
        make(group_size=3)
    with pytest.raises(ValueError, match="chunk_reset"):
        make(chunk_reset="later")
    env.close()
    with pytest.raises(ClosedEnvError):
        env.reset()


def test_skipping_requires_a_backend_that_can_skip():
    backend = SerialBackend([ToyEnv])
    backend.can_skip_envs = False
    with pytest.raises(ValueError, match="skip_finished_actions"):
        ChunkVectorEnv(backend, skip_finished_actions=True)
    assert ChunkVectorEnv(backend).skip_finished_actions is False


class _FewStatesToy(ToyEnv):
    num_initial_states = 7


def test_enumerate_initial_states_runs_each_exactly_once_with_auto_reset():
    import functools

    env = ChunkVectorEnv(SerialBackend([functools.partial(_FewStatesToy, 50)] * 3), auto_reset=True,
                         enumerate_initial_states=True)
    _, info = env.reset(seed=0)
    assert info["state_id"].tolist() == [0, 1, 2]
    seen, steps = [], 0
    finish = np.zeros((3, 1, 7), np.float32)
    finish[..., 6] = 1.0  # the toy's gripper > 0.5: success, the episode ends
    while not env.exhausted:
        out = env.chunk_step(finish)
        steps += 1
        seen += out.info["episode_state_id"][out.info["_episode"]].tolist()
        assert (out.info["episode_state_id"][~out.info["_episode"]] == -1).all()  # no row of an earlier chunk
        assert steps < 10
    assert sorted(seen) == list(range(7))  # every initial state exactly once
    assert not env.chunk_step(finish).valid.any()  # idle afterwards
    env.reset(seed=0)  # starts over
    assert not env.exhausted and env.instructions[0] == "count from 0"


def test_progress_flags_are_reported_per_step_and_as_once_per_episode():
    """A task's sub-goal (here ``reached``) comes back per sub-step like ``success``, and each
    finished episode says whether it was ever reached: partial success, reset with the episode."""
    from toy_env import ReachToyEnv

    env = ChunkVectorEnv(SerialBackend([lambda: ReachToyEnv(3)] * 2), ignore_terminations=True)
    assert env.progress_flags == ("reached",)
    assert env.episode_metrics == ("success_once", "success_at_end", "return", "length", "reached_once")
    env.reset(seed=0)
    a = actions(3, n=2)
    a[0, 1, 0] = 1.0  # env 0 reaches at its second step only
    out = env.chunk_step(a)
    assert out.info["reached"].tolist() == [[False, True, False], [False, False, False]]
    assert out.info["episode"]["reached_once"].tolist() == [True, False]
    assert out.info["episode"]["success_once"].tolist() == [False, False]
    out = env.chunk_step(actions(3, n=2))  # the next episodes (auto-reset) reach nothing
    assert out.info["episode"]["reached_once"].tolist() == [False, False]
    _, _, _, _, info = env.step(np.array([[1, 0, 0, 0, 0, 0, 0], [0] * 7], np.float32))
    assert info["reached"].tolist() == [True, False]
    assert make().episode_metrics == ("success_once", "success_at_end", "return", "length")  # no flags, none added


@pytest.mark.parametrize("requested,cuda,expected", [
    ("auto", True, "gpu"),    # a GPU node: its Vulkan driver, also under CPU physics (no lavapipe there)
    ("auto", False, "cpu"),   # a laptop or CI: lavapipe
    ("cpu", True, "cpu"), ("gpu", False, "gpu"),   # asked for: kept
])
def test_the_render_device_follows_what_is_present(requested, cuda, expected):
    from vla_envs.backends.maniskill.make import resolve_render_backend

    assert resolve_render_backend(requested, cuda_available=cuda) == expected


def test_an_unknown_render_backend_is_refused_with_the_choices():
    from vla_envs.backends.maniskill.make import resolve_render_backend

    with pytest.raises(ValueError, match=r"render_backend='vulkan'; allowed: \['auto', 'cpu', 'gpu'\]"):
        resolve_render_backend("vulkan")


@pytest.mark.parametrize("pool", [False, True])
def test_a_task_without_privileged_state_says_so(pool):
    from toy_env import make_toy_vector_env

    env = make_toy_vector_env(2, pool=pool)
    try:
        with pytest.raises(NotImplementedError, match="has no privileged expert state"):
            env.expert_state()
        env.reset(seed=0)  # the backend still serves
        assert env.chunk_step(np.zeros((2, 2, 7), np.float32)).valid.all()
    finally:
        env.close()


# --------------------------------------------------------------------- fuzzed actions
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from hypothesis.extra import numpy as hnp  # noqa: E402

_ACTIONS = hnp.arrays(
    st.sampled_from([np.float32, np.float64, np.float16, np.int32, np.uint8, np.bool_, np.complex64]),
    hnp.array_shapes(min_dims=0, max_dims=4, max_side=9),
)


@st.composite
def _bad_or_good_actions(draw):
    a = draw(_ACTIONS)
    if a.dtype.kind == "f" and a.size and draw(st.booleans()):  # NaN, inf and huge values in a real array
        flat = a.reshape(-1)
        flat[draw(st.integers(0, a.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf, 1e30, -1e30]))
    return a


@pytest.mark.reliability(fault="malformed actions into an env (hypothesis: shapes, dtypes, chunk sizes, NaN, "
                               "inf, huge values)", cases=300,
                         outcome="refused with an error naming the problem, or clipped; the env keeps stepping")
@settings(max_examples=300, deadline=None)
@given(actions=_bad_or_good_actions(), chunked=st.booleans())
def test_any_action_array_is_refused_or_clipped_and_the_env_goes_on(actions, chunked):
    env = make(n=2, max_steps=1000)
    env.reset(seed=0)
    step = env.chunk_step if chunked else env.step
    try:
        step(actions)
    except (TypeError, ValueError) as e:
        assert "actions" in str(e), str(e)
    else:  # only a well-formed array is executed: right shape, real, finite
        want_ndim = 3 if chunked else 2
        assert actions.ndim == want_ndim and actions.shape[0] == 2 and actions.shape[-1] == A
        assert actions.dtype.kind in "fiu" and np.isfinite(actions).all()
    env.chunk_step(np.zeros((2, 2, A), np.float32))  # still usable
    env.close()
