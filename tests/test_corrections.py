"""Correction demos: the policy starts each episode, the scripted expert takes over and finishes it."""

from __future__ import annotations

import json

import numpy as np
import pytest
from tiny_vla import tiny  # also sets HF_HUB_OFFLINE and one torch thread

from vla_envs.tasks.put_on_plate.expert import PHASES, ScriptedExpert
from vla_trainer.cli import main as cli_main
from vla_trainer.corrections import check_handover_steps


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
            "--num-envs", "1", "--handover-steps", "8", "--all", "--env-kwargs",
            json.dumps({"low_poly": True, "vectorization": "serial", "time_limit": 24})]
    assert cli_main(args) == 0
    printed = capsys.readouterr().out
    summary = json.loads(printed[printed.index("{"):])
    assert summary["episodes"] == 2 and summary["kept"] == 2
    index, recorded = load_demos(out)
    assert index["expert_kwargs"] == {"take_over_after_steps": [8]} and index["scene_bodies"] == ["tcp", "object", "plate"]
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
