"""The success-rate interval that ``vla-eval`` reports next to success_once, and re-planning
after the first K actions of each chunk (``--execute-steps``)."""

from __future__ import annotations

import pytest

from vla_trainer.rl.evaluation import wilson_interval


@pytest.mark.parametrize("successes,trials,expected", [
    (0, 32, (0.0, 3.8416 / 35.8416)),   # z^2 / (n + z^2): 0 of 32 still allows about 11 %
    (32, 32, (32 / 35.8416, 1.0)),
    (16, 32, (0.3363, 0.6637)),          # centre 0.5, half-width 1.96 * 0.09354 / 1.12005
])
def test_wilson_interval_matches_hand_computed_values(successes, trials, expected):
    low, high = wilson_interval(successes, trials)
    assert (low, high) == pytest.approx(expected, abs=1e-4)


def test_wilson_interval_narrows_with_more_episodes_and_contains_the_rate():
    for successes, trials in [(3, 32), (12, 128)]:
        low, high = wilson_interval(successes, trials)
        assert low < successes / trials < high
    assert wilson_interval(12, 128)[1] - wilson_interval(12, 128)[0] < wilson_interval(3, 32)[1] - wilson_interval(3, 32)[0]


@pytest.mark.parametrize("successes,trials", [(5, 4), (-1, 4), (0, 0)])
def test_wilson_interval_rejects_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="successes=.*trials="):
        wilson_interval(successes, trials)


# --- re-planning inside a chunk (--execute-steps) ---------------------------------------------

@pytest.fixture(scope="module")
def tiny_policy():
    from tiny_vla import tiny

    from vla_trainer.models import VLAPolicy

    return VLAPolicy(*tiny("tiny-openvla-oft", seed=0))


@pytest.mark.parametrize("execute_steps,calls_per_round", [(None, 2), (8, 2), (2, 8), (3, 6), (1, 16)])
def test_evaluation_re_plans_after_execute_steps_actions(tiny_policy, monkeypatch, execute_steps, calls_per_round):
    """A 16-step episode with a chunk of 8: the policy is asked 16 / K times (rounded up) per
    episode, and every episode still runs to its time limit."""
    from toy_env import make_bandit_vector_env

    from vla_trainer.rl.evaluation import evaluate_policy

    calls = []
    act = tiny_policy.act
    monkeypatch.setattr(tiny_policy, "act", lambda obs, **kw: calls.append(1) or act(obs, **kw))
    env = make_bandit_vector_env(num_envs=2, max_episode_steps=16, auto_reset=False, ignore_terminations=True)
    try:
        res = evaluate_policy(env, tiny_policy, 4, seed=0, execute_steps=execute_steps)
    finally:
        env.close()
    assert res["num_episodes"] == 4 and res["length"] == 16.0
    assert len(calls) == 2 * calls_per_round  # two rounds of two envs


@pytest.mark.parametrize("bad", [0, 9, -1, True, 2.0])
def test_execute_steps_outside_the_chunk_is_refused(bad):
    from vla_trainer.rl.evaluation import check_execute_steps

    with pytest.raises(ValueError, match=r"from 1 to the policy's chunk \(8\)"):
        check_execute_steps(bad, 8)
    check_execute_steps(None, 8)
    check_execute_steps(8, 8)


def test_evaluation_averages_the_tasks_progress_flags():
    """Partial success: with env 0 reaching in every episode and env 1 never, ``reached_once``
    is 0.5 over two rounds, beside the success metrics."""
    import types

    import numpy as np
    import torch
    from toy_env import ReachToyEnv

    from vla_envs.core import ChunkVectorEnv
    from vla_envs.core.serial import SerialBackend
    from vla_trainer.rl.evaluation import evaluate_policy

    class ReachWithEnvZero:
        chunk_size = 2

        def act(self, obs, **kw):
            actions = torch.zeros(2, 2, 7)
            actions[0, :, 0] = 1.0
            return types.SimpleNamespace(actions=actions)

    env = ChunkVectorEnv(SerialBackend([lambda: ReachToyEnv(4)] * 2), auto_reset=False, ignore_terminations=True)
    episodes, again, other = {}, {}, {}
    try:
        res = evaluate_policy(env, ReachWithEnvZero(), 4, seed=0, episodes=episodes)
        evaluate_policy(env, ReachWithEnvZero(), 4, seed=0, episodes=again)
        evaluate_policy(env, ReachWithEnvZero(), 4, seed=1, episodes=other)
    finally:
        env.close()
    assert len(episodes["state_id"]) == len(episodes["success_once"]) == 4
    assert sorted(again["state_id"]) == sorted(episodes["state_id"]) != sorted(other["state_id"])
    assert res["num_episodes"] == 4
    assert res["reached_once"] == 0.5 and res["success_once"] == 0.0
    assert set(res) == {"success_once", "success_at_end", "return", "length", "reached_once", "num_episodes"}
    assert np.isclose(res["return"], 0.4)


def test_comparison_to_a_baseline_tests_the_success_counts():
    from vla_trainer.rl.evaluation import compare_to_baseline

    def row(successes, n=128, env_id="PutOnPlateInScene25Main-v3"):
        return {"env_id": env_id, "num_episodes": n, "success_once": successes / n, "success_at_end": 0.0,
                "return": successes / n}

    lines = compare_to_baseline(row(6), row(16), ("warm start", "GRPO"))
    assert lines[0].startswith("success_once    warm start   4.69 %  ->  GRPO  12.50 %  (+7.81)")
    assert not any(line.startswith("grasped_once") for line in lines)  # only metrics both rows hold
    fisher = next(line for line in lines if "Fisher" in line)
    assert "6 of 128 -> 16 of 128 episodes" in fisher and "p = 0.0" in fisher
    assert float(fisher.split("p = ")[1].rstrip(")")) < 0.05
    assert "p = 1.000" in compare_to_baseline(row(6), row(6))[-3]  # equal counts: no evidence of a change
    assert lines[-2] == "initial states: not recorded in the warm start's eval.json, so not known to be the same"
    assert lines[-1] == "settings: not recorded in the warm start's eval.json, so not known to be the same"
    with pytest.raises(ValueError, match="compare evaluations of one task"):
        compare_to_baseline(row(6), row(6, env_id="PutCarrotOnPlateInScene-v1"))


def test_two_evaluations_of_the_same_states_are_also_compared_state_by_state():
    """Fisher's test treats the two evaluations as independent samples; on the same initial states
    the paired (McNemar) test counts only the states whose outcome changed."""
    from vla_trainer.rl.evaluation import compare_to_baseline, paired_success_test

    def row(successes, states):
        n = len(states)
        return {"env_id": "PutOnPlateInScene25Main-v3", "num_episodes": n, "success_once": sum(successes) / n,
                "success_at_end": 0.0, "return": 0.0,
                "episodes": {"state_id": list(states), "success_once": list(successes)}}

    states = [5, 3, 9, 7, 1, 2, 8, 4, 6, 0, 11, 12]
    before = [True, True] + [False] * 10  # the states 5 and 3
    after = [True, False] + [True] * 9 + [False]  # keeps 5, loses 3, wins nine
    assert paired_success_test(row(before, states)["episodes"], row(after, states)["episodes"]) == pytest.approx(
        (1, 9, 22 / 1024))  # two-sided binomial: 2 * P(X <= 1) = 2 * (1 + 10) / 2**10
    # the order episodes ended in does not matter, only which state each ran
    shuffled = row(after[::-1], states[::-1])
    lines = compare_to_baseline(row(before, states), shuffled)
    paired = next(line for line in lines if "state by state" in line)
    assert paired.startswith("success_once, state by state: 9 initial states won, 1 lost") and "p = 0.021" in paired
    # a state run twice is paired run by run; other states: no paired test
    assert paired_success_test({"state_id": [4, 4], "success_once": [True, False]},
                               {"state_id": [4, 4], "success_once": [True, True]}) == (0, 1, 1.0)
    assert paired_success_test(row(before, states)["episodes"], row(after, [s + 1 for s in states])["episodes"]) is None
    assert not any("state by state" in line for line in compare_to_baseline(row(before, states),
                                                                            row(after, [s + 1 for s in states])))


def test_a_comparison_says_whether_both_ran_with_the_same_settings():
    from vla_trainer.rl.evaluation import same_settings

    settings = {"env_kwargs": {"low_poly": True}, "asset_pack": "procedural", "terminate": False,
                "max_episode_steps": None, "expert_start_phase": None}
    assert same_settings(settings, dict(settings)).startswith("settings: the same env options")
    other = {**settings, "env_kwargs": {"low_poly": False}, "terminate": True}
    line = same_settings(settings, other)
    assert line.startswith("settings: NOT the same (env_kwargs {'low_poly': True} vs {'low_poly': False}; "
                           "terminate False vs True)")
    assert "not recorded in the baseline's" in same_settings({}, settings)


def test_a_comparison_says_whether_both_ran_the_same_initial_states():
    from vla_trainer.rl.evaluation import same_initial_states

    ids = {"state_id": [5, 3, 5, 9], "success_once": [True, False, False, True]}
    reordered = {"state_id": [9, 5, 3, 5], "success_once": [False] * 4}  # episodes end in another order
    assert same_initial_states(ids, reordered) == "initial states: the same 4 in both (3 distinct)"
    other = {"state_id": [5, 3, 7, 8], "success_once": [False] * 4}  # another --seed or --num-envs
    assert same_initial_states(ids, other).startswith("initial states: NOT the same (2 of 4 / 4 shared;")
    assert "not recorded in the policy's" in same_initial_states(ids, None)



def test_an_episode_cut_by_a_simulator_crash_is_left_out_not_counted_a_failure(tiny_policy):
    """Every episode succeeds (the gripper closes); env 1's simulator is killed during the first round:
    its episode ends as worker_crashed, and the rates are over the three episodes that ran."""
    import functools
    import os
    import signal
    import types

    import numpy as np
    import torch
    from toy_env import ToyEnv

    from vla_envs.core import ChunkVectorEnv
    from vla_envs.core.pool import ProcessPoolBackend
    from vla_trainer.rl.evaluation import evaluate_policy

    backend = ProcessPoolBackend([functools.partial(ToyEnv, 4)] * 2, restart_crashed=True)
    env = ChunkVectorEnv(backend, auto_reset=False, ignore_terminations=True)
    calls = []

    class CloseTheGripper:
        chunk_size = 2

        def act(self, obs, **kw):
            if not calls:
                os.kill(backend.pids[1], signal.SIGKILL)
            calls.append(1)
            actions = torch.zeros(2, 2, 7)
            actions[:, :, 6] = 1.0
            return types.SimpleNamespace(actions=actions)

    episodes = {}
    try:
        with pytest.warns(RuntimeWarning, match="env worker 1"):
            res = evaluate_policy(env, CloseTheGripper(), 4, seed=0, episodes=episodes)
    finally:
        env.close()
    assert res["crashed_episodes"] == 1 and res["num_episodes"] == 3 and len(episodes["state_id"]) == 3
    assert res["success_once"] == 1.0 and np.isclose(res["length"], 4.0)


def test_a_seeded_draw_is_the_generators_whatever_the_policys_device():
    """On one device a seeded draw is torch's own. (A policy on a GPU given an evaluation's CPU
    generator draws on the CPU, torch refusing a CPU generator for a GPU tensor: bench/gpu_check.py's
    generation part runs that; no GPU here.)"""
    import torch

    from vla_trainer.models.sampling import sample_indices

    logits = torch.randn(4, 3, 16, generator=torch.Generator().manual_seed(0))
    drawn = sample_indices(logits, torch.Generator().manual_seed(1))
    expected = torch.multinomial(torch.softmax(logits, -1).reshape(-1, 16), 1,
                                 generator=torch.Generator().manual_seed(1)).view(4, 3)
    assert torch.equal(drawn, expected)


def test_vla_eval_refuses_an_out_folder_it_cannot_write_before_it_runs(tmp_path, capsys):
    """An --out under a file was found only after every episode had run (a raw NotADirectoryError,
    the results lost): it is refused at once, before the checkpoint is even looked at."""
    from vla_trainer.cli.eval import main as vla_eval

    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for out, says in ((a_file, f"--out {a_file}: is a file"),
                      (a_file / "eval", f"--out {a_file / 'eval'}: {a_file} is a file")):
        with pytest.raises(SystemExit) as exit_:
            vla_eval(["--checkpoint", str(tmp_path / "no_model"), "--out", str(out)])
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and says in err and "no_model" not in err, err
