"""The shared-memory process pool: same results as in-process, errors named by env,
dead workers reported, nothing left running."""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
from toy_env import ToyEnv

from vla_envs.core import ChunkVectorEnv
from vla_envs.core.pool import ProcessPoolBackend
from vla_envs.core.serial import SerialBackend
from vla_envs.errors import AssetsMissingError, WorkerError

N = 3


def run(backend, chunks=4, c=3):
    env = ChunkVectorEnv(backend, use_fixed_reset_state_ids=True, group_size=N)
    obs, _ = env.reset(seed=11)
    rng = np.random.default_rng(0)
    trace = [obs]
    for _ in range(chunks):
        a = rng.uniform(-1, 1, (N, c, 7)).astype(np.float32)
        trace.append(env.chunk_step(a))
    env.close()
    return trace


@pytest.fixture
def pool():
    p = ProcessPoolBackend([functools.partial(ToyEnv, 5)] * N)
    yield p
    p.close()


def test_pool_matches_in_process_results():
    fns = [functools.partial(ToyEnv, 5)] * N
    serial, pooled = run(SerialBackend(fns)), run(ProcessPoolBackend(fns))
    for a, b in zip(serial[1:], pooled[1:]):
        for key in ("image", "state"):
            np.testing.assert_array_equal(a.obs[key], b.obs[key])
        for field in ("rewards", "terminated", "truncated", "valid"):
            np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
        assert a.obs["instruction"] == b.obs["instruction"]
    np.testing.assert_array_equal(serial[0]["image"], pooled[0]["image"])


def test_pool_passes_progress_flags_like_in_process():
    from toy_env import ReachToyEnv

    fns = [functools.partial(ReachToyEnv, 5)] * N
    serial, pooled = run(SerialBackend(fns)), run(ProcessPoolBackend(fns))
    assert any(out.info["reached"].any() for out in serial[1:])
    for a, b in zip(serial[1:], pooled[1:]):
        np.testing.assert_array_equal(a.info["reached"], b.info["reached"])
        if "episode" in a.info:
            np.testing.assert_array_equal(a.info["episode"]["reached_once"], b.info["episode"]["reached_once"])


def test_observations_come_through_shared_memory(pool):
    env = ChunkVectorEnv(pool)
    env.reset(seed=0, options={"state_ids": np.array([1, 2, 3])})
    # the pool's buffer is the array the workers wrote into, not a pickled copy
    assert pool._views["image"].base is not None
    assert pool._views["image"][:, 0, 0, 0].tolist() == [1, 2, 3]


@pytest.mark.reliability(fault='an env raising a Python error in a worker', cases=1,
                         outcome='refused: the error names the env; the pool keeps serving after a reset, '
                                 'and stepping on before one is refused')
def test_worker_exception_names_env_and_pool_survives(pool):
    env = ChunkVectorEnv(pool)
    env.reset(seed=0)
    pool.call(1, "fail_next_step", "raise")
    with pytest.raises(WorkerError, match="env worker 1 failed while stepping: ValueError: toy env failure") as e:
        env.step(np.zeros((N, 7), np.float32))
    assert e.value.env_index == 1
    # the other workers stepped, their records did not: stepping on is refused until a reset
    with pytest.raises(RuntimeError, match=r"env\(s\) \[0, 1, 2\] were not reset since a chunk step failed "
                                           r"part way \(WorkerError: env worker 1 failed while stepping"):
        env.chunk_step(np.zeros((N, 2, 7), np.float32))
    env.reset(options={"reset_mask": np.array([True, True, False])})
    with pytest.raises(RuntimeError, match=r"env\(s\) \[2\] were not reset since"):
        env.step(np.zeros((N, 7), np.float32))
    env.reset(seed=0)
    out = env.chunk_step(np.zeros((N, 2, 7), np.float32))  # every worker still serves
    assert out.valid.all()
    np.testing.assert_array_equal(out.obs["state"][:, 0], [2] * N)  # each simulator's step count, from the reset


@pytest.mark.reliability(fault='a worker dying with no restart policy', cases=1,
                         outcome='refused: WorkerError naming the env and the signal')
def test_dead_worker_is_reported_with_its_exit_code(pool):
    env = ChunkVectorEnv(pool)
    env.reset(seed=0)
    pool.call(2, "fail_next_step", "exit")
    with pytest.raises(WorkerError, match=r"env worker 2 \(pid \d+\) died while stepping: exit code 7") as e:
        env.step(np.zeros((N, 7), np.float32))
    assert e.value.env_index == 2
    env.close()


def _missing_assets():
    raise AssetsMissingError("assets for ToyTask not found under /nowhere; copy the pack there")


def test_startup_error_keeps_its_type_and_message():
    with pytest.raises(AssetsMissingError, match="copy the pack there"):
        ProcessPoolBackend([_missing_assets, functools.partial(ToyEnv, 5)])


def test_close_leaves_no_worker_processes(pool):
    pids = pool.pids
    pool.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


@pytest.mark.reliability(fault='simulator worker killed mid-rollout (SIGKILL)', cases=1,
                         outcome='survived: replaced, its episode truncated (worker_crashed), the others go on')
def test_restart_crashed_worker_truncates_its_episode_and_the_batch_goes_on():
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * N, restart_crashed=True)
    env = ChunkVectorEnv(backend, auto_reset=True)
    try:
        env.reset(seed=0)
        old_pid = backend.pids[1]
        os.kill(old_pid, signal.SIGKILL)  # mid-rollout, as a segfaulting simulator would
        with pytest.warns(RuntimeWarning, match="env worker 1 .* died while stepping: killed by signal SIGKILL"):
            out = env.chunk_step(np.zeros((N, 3, 7), np.float32))
        assert backend.pids[1] != old_pid and backend.restarts == 1
        assert out.truncated[1, 0] and not out.terminated[1].any()
        assert out.info["truncation_reason"][1] == "worker_crashed"
        assert out.valid[1].tolist() == [True, False, False]  # the rest of its chunk belongs to no episode
        others = [i for i in range(N) if i != 1]
        assert out.valid[others].all() and not out.truncated[others].any()  # nothing else lost
        assert out.info["_episode"][1] and out.info["episode"]["length"][1] == 1
        out = env.chunk_step(np.zeros((N, 2, 7), np.float32))  # the new worker runs a new episode
        assert out.valid.all() and out.obs["state"][1, 0] == 2  # reset by auto-reset, then 2 steps
    finally:
        env.close()


def test_a_crash_in_a_later_episode_of_the_chunk_is_that_episodes_reason_and_training_leaves_it_out():
    """Env 1's first episode ends at sub-step 0 (success terminates it); under ``chunk_reset="immediate"``
    without skipping, its next episode runs on the leftover sub-steps and its simulator dies in the
    first of them. ``truncation_reason`` is "" for the first episode (the one ``info["episode"]``
    reports; it said "worker_crashed" before), the later episode's record says "worker_crashed", and
    the trainer's episode statistics count the crash apart from the episodes that ran."""
    from vla_trainer.rl.rollout import CRASHED_EPISODES, finished_episodes

    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * 2, restart_crashed=True)
    env = ChunkVectorEnv(backend, auto_reset=True, chunk_reset="immediate", skip_finished_actions=False)

    def crash_env_1_after_sub_step_0(step):
        if step["done"][1] and not backend.restarts:
            backend.call(1, "fail_next_step", "exit")  # its next step (the new episode's first) kills it

    env.add_step_observer(crash_env_1_after_sub_step_0)
    try:
        env.reset(seed=0)
        actions = np.zeros((2, 3, 7), np.float32)
        actions[1, 0, 6] = 1.0  # env 1 succeeds at once
        with pytest.warns(RuntimeWarning, match="env worker 1 .* died while stepping"):
            out = env.chunk_step(actions)
        assert backend.restarts == 1
        assert out.info["truncation_reason"][1] == "" and out.terminated[1, 0] and out.truncated[1, 1]
        assert [r["truncation_reason"] for r in out.info["later_episodes"] if r["env"] == 1] == ["worker_crashed"]
        episodes = finished_episodes(out, first_step=0, horizon=100, time_limit=50)
        assert episodes["success_once"] == [1.0] and episodes[CRASHED_EPISODES] == [1.0]
    finally:
        env.close()


@pytest.mark.parametrize("contract", [dict(auto_reset=True, skip_finished_actions=False),
                                      dict(auto_reset=False, skip_finished_actions=False)])
def test_a_restarted_worker_is_not_stepped_before_it_is_reset(contract):
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * 2, restart_crashed=True)
    env = ChunkVectorEnv(backend, **contract)
    try:
        env.reset(seed=0)
        os.kill(backend.pids[1], signal.SIGKILL)
        with pytest.warns(RuntimeWarning, match="env worker 1"):
            out = env.chunk_step(np.zeros((2, 3, 7), np.float32))  # the rest of the chunk: not sent to it
        assert out.info["truncation_reason"][1] == "worker_crashed" and out.valid[0].all()
        out = env.chunk_step(np.zeros((2, 2, 7), np.float32))
        assert out.valid[0].all() and out.valid[1].all() == contract["auto_reset"]
        if not contract["auto_reset"]:
            env.reset(options={"reset_mask": np.array([False, True])})
            assert env.chunk_step(np.zeros((2, 2, 7), np.float32)).valid.all()
    finally:
        env.close()


def test_after_a_worker_error_the_others_answer_their_own_commands():
    """A death found while sending, and a hang, raise; what the other workers answer is read then,
    never taken later for the answer to another command."""
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * 3, step_timeout_s=2)
    try:
        backend.reset(np.arange(3), np.array([1, 2, 3]))
        os.kill(backend.pids[2], signal.SIGKILL)
        backend._procs[2].join(5)
        with pytest.raises(WorkerError, match="env worker 2"):
            backend.step(np.zeros((3, 7), np.float32), np.ones(3, bool))
        assert backend.reset(np.arange(2), np.array([7, 8]))[1] == ["count from 7", "count from 8"]
        hung = backend.pids[0]
        os.kill(hung, signal.SIGSTOP)
        with pytest.raises(WorkerError, match="env worker 0 .* did not answer within 2 s while stepping; it was killed"):
            backend.step(np.zeros((3, 7), np.float32), np.array([True, True, False]))
        with pytest.raises(ProcessLookupError):
            os.kill(hung, signal.SIGCONT)  # killed: no late answer can follow
        assert backend.reset(np.array([1]), np.array([9]))[1] == ["count from 9"]
    finally:
        backend.close()


def test_without_restart_a_crashed_worker_still_raises():
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * 2)
    try:
        backend.reset(np.arange(2), np.zeros(2, np.int64))
        os.kill(backend.pids[0], signal.SIGKILL)
        with pytest.raises(WorkerError, match="env worker 0"):
            backend.step(np.zeros((2, 7), np.float32), np.ones(2, bool))
    finally:
        backend.close()


def test_restart_crashed_does_not_hide_python_errors():
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * 2, restart_crashed=True)
    try:
        backend.reset(np.arange(2), np.zeros(2, np.int64))
        backend.call(1, "fail_next_step", "raise")
        with pytest.raises(WorkerError, match="toy env failure on purpose"):
            backend.step(np.zeros((2, 7), np.float32), np.ones(2, bool))
        assert backend.restarts == 0
    finally:
        backend.close()


def _shm_names(backend) -> list[str]:
    return [name for name, _, _ in backend._layout.values()]


@pytest.mark.reliability(fault='simulator worker hangs (SIGSTOP) past the step deadline', cases=1,
                         outcome='survived: killed, replaced, its episode truncated')
def test_a_hung_worker_is_killed_and_replaced_like_a_dead_one():
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * N, restart_crashed=True, step_timeout_s=2)
    env = ChunkVectorEnv(backend, auto_reset=True)
    try:
        env.reset(seed=0)
        hung = backend.pids[2]
        os.kill(hung, signal.SIGSTOP)  # alive, holding its pipe, never answering: a stuck simulator
        with pytest.warns(RuntimeWarning, match=r"env worker 2 .* did not answer within 2 s while stepping"):
            out = env.chunk_step(np.zeros((N, 3, 7), np.float32))
        with pytest.raises(ProcessLookupError):
            os.kill(hung, 0)  # killed and reaped, not left stopped
        assert backend.restarts == 1 and backend.pids[2] != hung
        assert out.info["truncation_reason"][2] == "worker_crashed" and out.truncated[2, 0]
        assert out.valid[:2].all()
        assert env.chunk_step(np.zeros((N, 2, 7), np.float32)).valid.all()
    finally:
        env.close()


@pytest.mark.reliability(fault='20 worker deaths and hangs in a row', cases=20,
                         outcome='survived: every episode truncated, no process or /dev/shm segment left')
def test_twenty_kills_in_a_row_leave_no_process_and_no_shared_memory():
    backend = ProcessPoolBackend([functools.partial(ToyEnv, 50)] * N, restart_crashed=True, step_timeout_s=2)
    env = ChunkVectorEnv(backend, auto_reset=True)
    rng = np.random.default_rng(0)
    seen, truncated = set(), 0
    try:
        env.reset(seed=0)
        for k in range(20):
            victim = int(rng.integers(N))
            seen.update(backend.pids)
            # mostly deaths (SIGKILL, as a segfault or the OOM killer), every fifth a hang
            os.kill(backend.pids[victim], signal.SIGSTOP if k % 5 == 4 else signal.SIGKILL)
            with pytest.warns(RuntimeWarning, match=f"env worker {victim} "):
                out = env.chunk_step(np.zeros((N, 2, 7), np.float32))
            truncated += int(out.info["truncation_reason"][victim] == "worker_crashed")
        assert backend.restarts == 20 and truncated == 20
        names = _shm_names(backend)
        assert all(os.path.exists(f"/dev/shm/{n}") for n in names)
        seen.update(backend.pids)
    finally:
        env.close()
    assert len(seen) == N + 20
    for pid in seen:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not any(os.path.exists(f"/dev/shm/{n}") for n in names)
