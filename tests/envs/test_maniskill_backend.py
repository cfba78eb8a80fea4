"""The contract against the real ManiSkill CPU backend (PhysX CPU + lavapipe rendering)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest

import vla_envs  # noqa: F401
from vla_envs.core import ChunkVectorEnv

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]
pytest.importorskip("mani_skill", reason="needs the [maniskill] extra: bash scripts/setup.sh maniskill")

N, C, MAX_STEPS = 2, 4, 6


@pytest.fixture(scope="module")
def env():
    e = gym.make("vla/PickCube-v1", num_envs=N, image_size=64, time_limit=MAX_STEPS,
                 use_fixed_reset_state_ids=True, group_size=N)
    yield e
    e.close()


def test_make_returns_contract_with_documented_obs(env):
    assert isinstance(env, ChunkVectorEnv)
    obs, info = env.reset(seed=0)
    assert obs["image"].shape == (N, 64, 64, 3) and obs["image"].dtype == np.uint8
    # qpos 9, TCP pose 7, then the goal: the cameras do not show PickCube's target
    assert obs["state"].shape == (N, 19) and obs["state"].dtype == np.float32
    goal = obs["state"][:, 16:]  # PickCube draws it within 10 cm of the table's centre, up to 30 cm high
    assert (np.abs(goal[:, :2]) <= 0.1 + 1e-6).all() and ((goal[:, 2] >= 0) & (goal[:, 2] <= 0.35)).all()
    other, _ = env.reset(seed=1)
    assert not np.allclose(other["state"][:, 16:], goal)  # a new episode, a new goal
    assert obs["instruction"] == ("pick up the red cube and move it to the green target",) * N
    assert env.observation_space.contains(obs)
    assert obs["image"].std() > 5  # a rendered scene, not a blank buffer


def test_seeded_resets_are_deterministic_and_groups_share_state(env):
    a, ia = env.reset(seed=0)
    b, ib = env.reset(seed=0)
    c, ic = env.reset(seed=1)
    assert ia["state_id"].tolist() == ib["state_id"].tolist() != ic["state_id"].tolist()
    np.testing.assert_array_equal(a["image"], b["image"])
    assert not np.array_equal(a["image"], c["image"])
    # one group: both envs start from the same initial state, in two processes
    np.testing.assert_array_equal(a["image"][0], a["image"][1])
    np.testing.assert_array_equal(a["state"][0], a["state"][1])


def test_chunks_truncate_auto_reset_and_keep_final_obs(env):
    env.reset(seed=5)
    rng = np.random.default_rng(0)
    a = np.repeat(rng.uniform(-1, 1, (1, C, 7)).astype(np.float32), N, axis=0)
    first = env.chunk_step(a)
    assert first.valid.all() and not first.truncated.any()
    # same actions from the same state in two processes: same physics
    np.testing.assert_allclose(first.rewards[0], first.rewards[1], rtol=1e-5)
    second = env.chunk_step(a)
    # MAX_STEPS=6: the episode ends at the 2nd sub-step of the 2nd chunk
    assert second.truncated[:, 1].all() and not second.truncated[:, [0, 2, 3]].any()
    assert second.valid.tolist() == [[True, True, False, False]] * N
    assert (second.rewards[:, 2:] == 0).all()
    assert second.info["_final_obs"].all() and (second.info["episode"]["length"] == MAX_STEPS).all()
    # PickCube's is_grasped comes through the worker pool as the contract's progress flag
    assert env.progress_flags == ("grasped",) and second.info["grasped"].shape == (N, C)
    assert second.info["episode"]["grasped_once"].dtype == bool
    assert not np.array_equal(second.info["final_obs"]["image"], second.obs["image"])
    # the auto-reset observation is exactly the initial state its id names
    ids = second.info["state_id"]
    assert ids[0] == ids[1]
    obs, info = env.reset(options={"state_ids": ids})
    np.testing.assert_array_equal(obs["image"], second.obs["image"])


def test_bad_actions_leave_the_pool_usable(env):
    env.reset(seed=0)
    with pytest.raises(ValueError, match="NaN"):
        env.step(np.full((N, 7), np.nan, np.float32))
    with pytest.raises(ValueError, match="shape"):
        env.chunk_step(np.zeros((N, 7), np.float32))
    out = env.chunk_step(np.zeros((N, 2, 7), np.float32))
    assert out.valid.all()


def test_a_maniskill_task_without_privileged_state_says_so_on_each_backend(env):
    """PickCube has no expert_state: the pool answers NotImplementedError as the batched backend does,
    not a worker's AttributeError, and the workers serve on."""
    with pytest.raises(NotImplementedError, match="has no privileged expert state"):
        env.expert_state()
    env.reset(seed=0)
    assert env.chunk_step(np.zeros((N, 1, 7), np.float32)).valid.all()


def test_single_env_passes_gymnasium_env_checker():
    from gymnasium.utils.env_checker import check_env

    from vla_envs.backends.maniskill.task_env import ManiSkillTaskEnv

    single = ManiSkillTaskEnv("PickCube-v1", "pick up the red cube", image_hw=(32, 32))
    try:
        check_env(single, skip_render_check=True)
    finally:
        single.close()


@pytest.mark.gpu
def test_gpu_batched_backend_in_process():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from vla_envs.backends.maniskill.gpu import ManiSkillGPUBackend

    env = gym.make("vla/PickCube-v1", num_envs=8, image_size=64, time_limit=MAX_STEPS)
    try:
        assert isinstance(env.backend, ManiSkillGPUBackend) and not env.skip_finished_actions
        env.reset(seed=0)
        out = env.chunk_step(np.zeros((8, C, 7), np.float32))
        out = env.chunk_step(np.zeros((8, C, 7), np.float32))
        assert out.truncated[:, 1].all() and out.info["_final_obs"].all()
        assert env.progress_flags == ("grasped",) and not out.info["episode"]["grasped_once"].any()  # never closed
    finally:
        env.close()


def test_missing_assets_raise_with_the_download_command_never_a_prompt():
    from vla_envs.backends.maniskill import make_maniskill_vector_env
    from vla_envs.errors import AssetsMissingError

    # a ManiSkill task whose Bridge assets are a download (absent here and in CI)
    with pytest.raises(AssetsMissingError, match="download_asset PutCarrotOnPlateInScene-v1"):
        make_maniskill_vector_env("PutCarrotOnPlateInScene-v1", "put carrot on plate",
                                  num_envs=1, sim_backend="physx_cpu")


def test_the_batched_in_process_backend_runs_on_cpu_physics():
    """``ManiSkillGPUBackend``'s code path (one batched scene in this process, ``env_idx`` partial
    resets, torch tensors to numpy, all envs stepped together) on CPU PhysX with one env, through
    the contract, so it is tested where there is no GPU."""
    from vla_envs.backends.maniskill.gpu import ManiSkillGPUBackend

    backend = ManiSkillGPUBackend("PickCube-v1", "pick up the cube", 1, (64, 64), sim_backend="physx_cpu",
                                  render_backend="cpu")
    env = ChunkVectorEnv(backend, time_limit=5)
    try:
        assert not env.skip_finished_actions  # the batch steps every env at once
        obs, info = env.reset(seed=3)
        assert obs["image"].shape == (1, 64, 64, 3) and obs["image"].dtype == np.uint8 and obs["image"].std() > 5
        assert obs["state"].shape == (1, 19) and obs["state"].dtype == np.float32
        goal = backend._env.unwrapped.goal_site.pose.p  # the state ends with the target the cameras hide
        np.testing.assert_allclose(obs["state"][0, 16:], goal[0].cpu().numpy(), atol=1e-6)
        again, _ = env.reset(options={"state_ids": info["state_id"]})
        np.testing.assert_array_equal(again["image"], obs["image"])  # a partial reset to the same id
        out = env.chunk_step(np.zeros((1, 4, 7), np.float32))
        assert out.rewards.dtype == np.float32 and out.valid.all()
        out = env.chunk_step(np.zeros((1, 4, 7), np.float32))
        assert out.truncated[0, 0] and out.valid[0].tolist() == [True, False, False, False]
        assert out.info["episode"]["length"][0] == 5 and "grasped_once" in out.info["episode"]
    finally:
        env.close()
    with pytest.raises(ValueError, match="num_envs=2"):
        ManiSkillGPUBackend("PickCube-v1", None, 2, (64, 64), sim_backend="physx_cpu")


def test_fixed_reset_ids_on_a_batch_that_cannot_honour_them_are_refused(monkeypatch):
    """ManiSkill's own tasks on a GPU batch draw a reset's states from one stream seeded by its first
    env, so GRPO's groups (same id, same state) cannot hold there: refused, naming what works. Here the
    batched backend runs one env on CPU physics (where ids do fix states), told it is such a batch."""
    import vla_envs.backends.maniskill.gpu as gpu
    from vla_envs.backends.maniskill.make import make_maniskill_vector_env

    one = gpu.ManiSkillGPUBackend("PickCube-v1", None, 1, (32, 32), sim_backend="physx_cpu", render_backend="cpu")
    assert one.ids_fix_states  # a batch of one: its id is its seed
    one.close()
    closed = []

    class Batch(gpu.ManiSkillGPUBackend):
        def __init__(self, *a, **kw):
            super().__init__(*a, **kw)
            self.ids_fix_states = False  # as PickCube with num_envs > 1 on the GPU

        def close(self):
            closed.append(True)
            super().close()

    monkeypatch.setattr(gpu, "ManiSkillGPUBackend", Batch)
    with pytest.raises(ValueError, match="use_fixed_reset_state_ids.*sim_backend='physx_cpu'"):
        make_maniskill_vector_env("PickCube-v1", None, 1, vectorization="batched", image_size=32,
                                  render_backend="cpu", use_fixed_reset_state_ids=True)
    assert closed == [True]
    make_maniskill_vector_env("PickCube-v1", None, 1, vectorization="batched", image_size=32,
                              render_backend="cpu").close()  # without fixed ids: built


@pytest.mark.reliability(fault="ManiSkill worker killed mid-rollout (SIGKILL)", cases=1,
                         outcome="survived: replaced, its episode truncated (worker_crashed), the others go on")
def test_a_killed_maniskill_worker_is_replaced_and_its_episode_truncated(env):
    import os
    import signal

    backend = env.backend
    env.reset(seed=3)
    victim = backend.pids[1]
    os.kill(victim, signal.SIGKILL)
    with pytest.warns(RuntimeWarning, match="env worker 1 .* died while stepping: killed by signal SIGKILL"):
        out = env.chunk_step(np.zeros((N, 2, 7), np.float32))
    assert backend.pids[1] != victim
    assert out.info["truncation_reason"][1] == "worker_crashed" and out.truncated[1, 0]
    assert out.valid[0].all() and not out.truncated[0].any()
    obs, _ = env.reset(seed=3)  # the new worker simulates and renders like the old one
    assert obs["image"][1].std() > 5


@pytest.mark.parametrize("image_size", ["128", -4, (64,), 64.0, (64, True)])
def test_a_bad_image_size_is_refused_before_the_simulator_starts(image_size):
    """It reached SAPIEN's camera constructor (a TypeError inside a worker): "128" as ('1', '2', '8')."""
    with pytest.raises(ValueError, match="image_size=.*a side in pixels or \\(height, width\\)"):
        gym.make("vla/PickCube-v1", num_envs=1, image_size=image_size)
