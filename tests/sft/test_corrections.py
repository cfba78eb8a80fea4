"""Correction demos: the policy starts each episode, the scripted expert takes over and finishes it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from expert_policy import ExpertAsPolicy
from tiny_vla import tiny  # also sets HF_HUB_OFFLINE and one torch thread

from vla_envs.tasks.put_on_plate.expert import PHASES, ScriptedExpert
from vla_trainer.cli.train import main as cli_main
from vla_trainer.sft.corrections import check_grasp_delays, check_handover_steps


def pose(x: float, y: float, z: float) -> np.ndarray:
    return np.array([x, y, z, 1.0, 0.0, 0.0, 0.0])


def test_take_over_descends_only_from_above_the_object_and_carries_on_what_is_held():
    expert = ScriptedExpert(4)
    expert.phase[:] = PHASES.index("carry")  # whatever the envs did before
    expert.timer[:] = 5
    obj = pose(0.0, 0.0, 0.02)
    states = [{"tcp": pose(0.01, 0.01, 0.10), "object": obj},   # 1.4 cm aside, above: descend from here
              {"tcp": pose(0.05, 0.0, 0.10), "object": obj},    # 5 cm aside: back above the object first
              {"tcp": pose(0.0, 0.0, 0.01), "object": obj},     # beside it, below its middle: above first
              {"tcp": pose(0.0, 0.0, 0.03), "object": obj, "grasped": True}]  # held: keep it, rise, carry
    expert.take_over(np.array([0, 1, 2, 3]), states)
    assert [PHASES[p] for p in expert.phase] == ["descend", "above", "above", "lift"]
    assert (expert.timer == 0).all()


@pytest.mark.parametrize("steps", [[], [0], [4], [12], [80], [8, 88]])
def test_handover_steps_must_be_whole_chunks_inside_the_episode(steps):
    with pytest.raises(ValueError, match="multiple of the policy's chunk"):
        check_handover_steps(steps, chunk_size=8, time_limit=80)
    check_handover_steps([8, 16, 72], chunk_size=8, time_limit=80)


@pytest.mark.parametrize("delays", [[-1], [80], [0, 8, 100]])
def test_grasp_delays_must_fall_inside_the_episode(delays):
    with pytest.raises(ValueError, match=r"in \[0, 80\) env steps"):
        check_grasp_delays(delays, time_limit=80)
    check_grasp_delays([0, 5, 79], time_limit=80)


def test_cli_names_a_bad_grasp_delay(tmp_path, capsys):
    args = ["collect-corrections", "--checkpoint", str(tmp_path / "none"), "--out", str(tmp_path / "c"),
            "--handover-after-grasp", "0,soon"]
    assert cli_main(args) == 2
    assert "--handover-after-grasp '0,soon'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.maniskill
def test_hand_over_follows_the_policys_own_grasp(tmp_path, monkeypatch):
    """With a grasp delay of 0 the expert takes over at the first step the policy holds the object,
    long before the fixed hand-over step, keeps it closed and solves the episode; with
    ``only_held`` the episode of a policy that never grasped is not kept, though the expert
    finished it. (A hand-over at the fixed step alone records nothing here: the grasping policy
    solves its episode before step 48, the other one never holds the object.)"""
    pytest.importorskip("mani_skill")
    import gymnasium as gym

    from vla_envs.demos import load_demos
    from vla_envs.registry import get_task
    from vla_envs.tasks.put_on_plate.expert import CLOSE
    from vla_trainer.sft.corrections import _collect

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path / "assets"))
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=2, image_size=32, low_poly=True, vectorization="serial",
                   time_limit=56, auto_reset=True)
    try:
        summary = _collect(env, get_task("PutOnPlateInScene25Main-v3"), ExpertAsPolicy(env, idle_envs=(1,)),
                           tmp_path / "c", 2, handover_steps=[48], grasp_delays=[0], only_held=True,
                           temperature=0.6, seed=1, only_success=True)
    finally:
        env.close()
    assert summary["episodes"] == 2 and summary["handovers_holding_the_object"] == 1 and summary["kept"] == 1
    index, [recorded] = load_demos(tmp_path / "c")
    assert index["expert_kwargs"] == {"take_over_after_steps": [48], "take_over_after_grasp_steps": [0],
                                      "only_held": True}
    [meta] = index["episodes"]
    assert meta["held_at_handover"] == 1.0 and meta["success_once"] == 1.0
    assert 0 < meta["handover_step"] < 40 and len(recorded["action"]) == meta["length"] - meta["handover_step"]
    assert recorded["action"][0, 6] == CLOSE  # the expert kept what the policy held
    assert summary["frames_recorded"] == len(recorded["action"])


@pytest.mark.slow
@pytest.mark.maniskill
def test_cli_records_only_the_experts_part(tmp_path, capsys, monkeypatch):
    pytest.importorskip("mani_skill")
    from vla_envs.demos import load_demos

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path / "assets"))
    model, tok = tiny("tiny-openvla-oft", seed=0)
    model.save_pretrained(tmp_path / "policy")
    tok.save_pretrained(tmp_path / "policy")
    out = tmp_path / "corrections"
    args = ["collect-corrections", "--checkpoint", str(tmp_path / "policy"), "--out", str(out), "--episodes", "2",
            "--num-envs", "1", "--handover-steps", "8", "--all", "--expert-kwargs", '{"max_speed": 0.5}',
            "--env-kwargs", json.dumps({"low_poly": True, "vectorization": "serial", "time_limit": 24})]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{"):])
    assert summary["episodes"] == 2 and summary["kept"] == 2
    index, recorded = load_demos(out)
    assert index["expert_kwargs"] == {"max_speed": 0.5, "take_over_after_steps": [8]}
    assert index["scene_bodies"] == ["tcp", "object", "plate"]
    for meta, ep in zip(index["episodes"], recorded):
        # the random policy's first chunk is not recorded; every recorded step is the expert's
        assert len(ep["action"]) == meta["length"] - 8 and ep["scene"].shape == (len(ep["action"]), 21)
        assert set(np.unique(ep["action"][:, 6])) <= {-1.0, 1.0}  # the expert's gripper commands, exactly
    assert summary["frames_recorded"] == sum(len(ep["action"]) for ep in recorded)
    # a folder that already holds demos is not overwritten, and bad hand-overs are named
    assert cli_main(args) == 2
    assert "already holds demos" in capsys.readouterr().err
    bad = args[:]
    bad[bad.index("--out") + 1] = str(tmp_path / "other")
    bad[bad.index("--handover-steps") + 1] = "5"
    assert cli_main(bad) == 2
    assert "multiple of the policy's chunk (8)" in capsys.readouterr().err
    bad = args[:]
    bad[bad.index("--out") + 1] = str(tmp_path / "other")
    bad[bad.index("--expert-kwargs") + 1] = '{"speed": 0.3}'
    assert cli_main(bad) == 2
    assert "unexpected keyword argument 'speed'" in capsys.readouterr().err and not (tmp_path / "other").exists()


def test_corrections_act_in_the_scene_the_checkpoint_was_trained_in(tmp_path):
    """The shipped warm start was trained on a crop of the low-poly scene: run in the default env, it
    acted on a full view it never saw. Its recorded scene is the default; the command line changes it."""
    from shipped_paths import SHIPPED_WARM_START

    from vla_trainer.cli.train import corrections_env
    from vla_trainer.deploy.serve import training_env

    task, trained = training_env(SHIPPED_WARM_START)
    env_id, kwargs = corrections_env(SHIPPED_WARM_START, None, {"time_limit": 24})
    assert env_id == task and kwargs["camera_crop"] == trained["camera_crop"] and kwargs["time_limit"] == 24
    assert "image_size" not in kwargs  # how the demos ran, not what they show: the policy's own size is used
    assert corrections_env(SHIPPED_WARM_START, "PutOnPlateInScene25VisionImage-v3", {"low_poly": False})[0] == \
        "PutOnPlateInScene25VisionImage-v3"
    assert corrections_env(SHIPPED_WARM_START, None, {"low_poly": False})[1]["low_poly"] is False
    model, tok = tiny("tiny-openvla-oft", seed=0)  # a model that records nothing: the default task, as given
    model.save_pretrained(tmp_path / "bare")
    tok.save_pretrained(tmp_path / "bare")
    assert corrections_env(tmp_path / "bare", None, {}) == ("PutOnPlateInScene25Main-v3", {})
