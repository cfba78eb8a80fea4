"""Placement -> workers (vla_trainer.runtime.placement): modes, GPU and CPU devices, oversubscribed
CPU layouts, and every error naming its key. Pure logic: no Ray, no simulator."""

from __future__ import annotations

import pytest

from vla_trainer.config import ConfigError, load_config
from vla_trainer.runtime import resolve_placement

TINY = "cpu_ppo_tiny_put_on_plate"


def placement(env, rollout, actor, *extra, gpus=0, cores=(0, 1), runtime="ray"):
    cfg = load_config(TINY, [f"cluster.runtime={runtime}", f"cluster.component_placement.env={env}",
                             f"cluster.component_placement.rollout={rollout}",
                             f"cluster.component_placement.actor={actor}", *extra])
    return resolve_placement(cfg, gpus=gpus, cores=list(cores))


def layout(p):
    return {c: [w.device for w in ws] for c, ws in p.workers.items()}


def test_colocated_on_two_cores_puts_one_worker_of_each_component_per_core():
    p = placement("all", "all", "all")
    assert p.mode == "colocated" and p.kind == "cpu"
    assert layout(p) == {"env": [0, 1], "rollout": [0, 1], "actor": [0, 1]}
    assert all(w.share == 3 for ws in p.workers.values() for w in ws)
    assert p.envs_per_worker == 2 and p.envs_per_stage == 2


def test_paper_layouts_scaled_to_four_cpu_devices_on_two_cores():
    # the paper's 8-GPU disaggregated layout 0-1 / 2-3 / 4-7, halved: env and rollout share core 0
    dis = placement("0", "1", "2-3", "cluster.num_devices=4")
    assert dis.mode == "disaggregated"
    assert layout(dis) == {"env": [0], "rollout": [0], "actor": [1]}
    hyb = placement("0-1", "2-3", "0-3", "cluster.num_devices=4", "rollout.pipeline_stage_num=2")
    assert hyb.mode == "hybrid"
    assert layout(hyb) == {"env": [0], "rollout": [1], "actor": [0, 1]}
    assert hyb.envs_per_worker == 4 and hyb.envs_per_stage == 2


def test_gpu_devices_one_worker_per_gpu_and_shares():
    p = placement("0-3", "4-7", "0-7", "env.train.total_num_envs=8", gpus=8)
    assert p.kind == "cuda" and p.mode == "hybrid"
    assert layout(p) == {"env": [0, 1, 2, 3], "rollout": [4, 5, 6, 7], "actor": list(range(8))}
    assert {w.share for w in p.workers["actor"]} == {2}
    assert p.envs_per_worker == 2


def test_cores_follow_the_process_affinity():
    p = placement("all", "all", "all", cores=(3, 5))
    assert layout(p)["env"] == [3, 5]


def test_two_nodes_double_the_device_ids():
    p = placement("0-7", "8-15", "0-15", "cluster.num_nodes=2", "env.train.total_num_envs=8", gpus=8)
    assert [w.node for w in p.workers["rollout"]] == [1] * 8
    assert [w.device for w in p.workers["rollout"]] == list(range(8))


@pytest.mark.parametrize("extra, gpus, key, fragment", [
    (["cluster.component_placement.env=0-2", "cluster.component_placement.rollout=0-2",
      "cluster.component_placement.actor=0-2"], 0, "cluster.component_placement.env", "out of range"),
    (["cluster.num_devices=9"], 8, "cluster.num_devices", "GPU"),
    (["env.train.total_num_envs=3"], 0, "env.train.total_num_envs", "env workers"),
    (["rollout.pipeline_stage_num=4", "env.train.total_num_envs=4"], 0, "rollout.pipeline_stage_num", "per env worker"),
])
def test_errors_name_the_key(extra, gpus, key, fragment):
    with pytest.raises(ConfigError) as info:
        placement("all", "all", "all", *extra, gpus=gpus)
    assert key in str(info.value) and fragment in str(info.value)


def test_group_must_fit_in_a_pipeline_stage():
    with pytest.raises(ConfigError) as info:
        cfg = load_config("cpu_grpo_tiny_put_on_plate", [
            "cluster.runtime=ray", "algorithm.group_size=4", "env.train.total_num_envs=8",
            "rollout.pipeline_stage_num=4"])
        resolve_placement(cfg, gpus=0, cores=[0])
    assert "algorithm.group_size" in str(info.value) and "pipeline stage" in str(info.value)


def test_rollout_workers_must_divide_env_workers():
    with pytest.raises(ConfigError) as info:
        placement("0", "1-2", "0-2", "cluster.num_devices=3", cores=(0, 1, 2))
    assert "cluster.component_placement.rollout" in str(info.value)


def test_local_runtime_is_colocated_only():
    with pytest.raises(ConfigError) as info:
        load_config(TINY, ["cluster.runtime=local", "cluster.component_placement.env=0",
                           "cluster.component_placement.rollout=1", "cluster.component_placement.actor=0-1"])
    assert "cluster.runtime" in str(info.value) and "hybrid" in str(info.value)


def test_describe_names_mode_and_devices():
    text = placement("0", "1", "2-3", "cluster.num_devices=4").describe()
    assert text.startswith("disaggregated") and "actor 1 worker(s) on core 1" in text
