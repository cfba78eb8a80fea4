"""The shipped warm start (warm_start/tiny-openvla-oft-put-on-plate, made by
scripts/make_warm_start.sh): it loads with the current model code, reads the robot state, says how
it was made, saw the view the PPO recipe trains on, and drives the real env through vla-eval."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
import torch
from tiny_vla import tiny  # noqa: F401  (sets HF_HUB_OFFLINE and one torch thread)
from shipped_paths import SHIPPED_WARM_START

from vla_trainer.config import load_config
from vla_trainer.data import scene_options
from vla_trainer.models import load_pretrained


def test_loads_as_the_float32_tiny_oft_preset_with_learned_slots():
    model, tokenizer = load_pretrained(SHIPPED_WARM_START)
    assert type(model).__name__ == "OpenVLAOFTForActionPrediction" and tokenizer is not None
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    cfg = model.config
    assert (cfg.image_size, cfg.chunk_size, cfg.slot_embeddings) == (64, 8, "learned")
    assert sum(p.numel() for p in model.parameters()) < 20e6
    # its last stage added the robot-state token, z-scored with the demos' statistics
    assert cfg.proprio_dim > 0 and model.proprio_projector is not None
    stats = cfg.proprio_stats
    assert len(stats["mean"]) == len(stats["std"]) == cfg.proprio_dim and min(stats["std"]) > 0


def test_made_by_matches_the_recipe_it_warm_starts():
    made_by = json.loads((SHIPPED_WARM_START / "made_by.json").read_text())
    recipe = load_config("cpu_ppo_tiny_put_on_plate")
    assert made_by["script"] == "scripts/make_warm_start.sh"
    assert made_by["demos"]["env_id"] == recipe.env.train.task
    scene = dict(recipe.env.train.env_kwargs)
    assert scene == dict(recipe.env.eval.env_kwargs)
    # made before native_render existed, when every picture was rendered at image_size: the recipe says so
    assert scene.pop("native_render") is False
    assert made_by["demos"]["env_kwargs"] == scene
    last = made_by["stages"][-1]
    assert last["settings"]["proprio"] and not any(s["settings"].get("proprio") for s in made_by["stages"][:-1])
    # it learned more than the actions' mode: its greedy action is closer to the expert's than "do nothing"
    assert last["final_action_l1"] < 0.8 * last["action_l1_of_zero"]
    assert not any("/" in str(v) for v in made_by["demos"].values() if isinstance(v, str))


def test_its_vision_pretraining_located_the_object_and_plate_on_held_out_episodes():
    vision = json.loads((SHIPPED_WARM_START / "made_by.json").read_text())["vision_pretraining"]
    assert vision["num_val_frames"] > 0 and "object.x" in vision["targets"]
    after, of_mean = vision["val_after"], vision["val_of_mean"]
    for body in ("tcp", "object", "plate"):
        assert after[f"{body}_cm"] < 0.5 * of_mean[f"{body}_cm"], body


@pytest.mark.slow
@pytest.mark.maniskill
def test_vla_eval_runs_the_shipped_warm_start(tmp_path, monkeypatch, capsys):
    """As the main job evaluates it: on its recipe's evaluation env (``--env-from``), which the
    command line's ``--env-kwargs`` extend."""
    from vla_trainer.cli.eval import main as vla_eval

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path / "assets"))
    recipe = load_config("cpu_grpo_tiny_put_on_plate_easy").env.eval
    assert vla_eval(["--checkpoint", str(SHIPPED_WARM_START), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--env-from", "cpu_grpo_tiny_put_on_plate_easy",
                     "--env-kwargs", '{"time_limit": 8}', "--out", str(tmp_path / "eval")]) == 0
    report = json.loads((tmp_path / "eval" / "eval.json").read_text())
    assert report["env_kwargs"] == {**recipe.env_kwargs, "time_limit": 8}
    row = report["rows"][0]
    assert row["env_id"] == recipe.task == "PutOnPlateInScene25EasyHeldOut-v3"
    assert row["num_episodes"] == 1 and row["length"] == 8 and row["asset_pack"] == "procedural"
    assert vla_eval(["--checkpoint", str(SHIPPED_WARM_START), "--env-from", "cpu_grpo_tiny_put_on_plate_eazy"]) == 2
    assert "--env-from cpu_grpo_tiny_put_on_plate_eazy" in capsys.readouterr().err
    # the recipe's whole evaluation: its episode end and step limit, and its sampling, as its run evaluated
    recipe_file = tmp_path / "recipe.yaml"
    recipe_file.write_text("defaults: [cpu_grpo_tiny_put_on_plate_easy]\n"
                           "env: {eval: {max_episode_steps: 4, ignore_terminations: false}}\n"
                           "algorithm: {sampling_params: {temperature_eval: 0.9, top_k: 5}}\n")
    assert vla_eval(["--checkpoint", str(SHIPPED_WARM_START), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--env-from", str(recipe_file), "--out", str(tmp_path / "e2")]) == 0
    report = json.loads((tmp_path / "e2" / "eval.json").read_text())
    row = report["rows"][0]
    assert row["length"] <= 4 and row["max_episode_steps"] == 4 and row["terminate"] is True
    assert report["sampling"] == "temperature 0.9, top-k 5"
    # a paper recipe names no model (its run does): its evaluation env is still read
    from vla_trainer.cli.eval import resolve_env

    args = argparse.Namespace(env_from="maniskill_grpo_openvla", task=None, env_kwargs={}, terminate=None,
                              greedy=None, temperature=None, top_k=None, seed=None, num_envs=None, num_episodes=None)
    resolve_env(args)
    assert (args.task, args.terminate, args.top_k, args.recipe_unnorm_key) == (
        "PutOnPlateInScene25Main-v3", False, 50, "bridge_orig")
    # and its initial states: the recipe's seed, envs per round and episodes
    paper = load_config("maniskill_grpo_openvla", [f"actor.model.model_path={SHIPPED_WARM_START}"])
    assert (args.seed, args.num_envs, args.num_episodes) == (
        paper.actor.seed, paper.env.eval.total_num_envs, paper.env.eval.num_episodes)


@pytest.mark.slow
@pytest.mark.maniskill
def test_vla_eval_from_an_expert_phase_is_labelled_and_starts_there(tmp_path, monkeypatch, capsys):
    """``--expert-start-phase lower``: every episode starts with the object held over the plate
    (grasped at once, where the plain evaluation of the same episodes holds nothing in 3 steps),
    and the report says that this is not the task's success rate. The env option itself is refused."""
    from vla_trainer.cli.eval import main as vla_eval

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path / "assets"))
    kwargs = {**load_config("cpu_ppo_tiny_put_on_plate").env.eval.env_kwargs, "time_limit": 3}
    common = ["--checkpoint", str(SHIPPED_WARM_START), "--num-envs", "2", "--num-episodes", "2", "--seed", "7",
              "--vectorization", "serial", "--env-kwargs", json.dumps(dict(kwargs))]
    rows = {}
    for name, extra in (("plain", []), ("lower", ["--expert-start-phase", "lower"])):
        assert vla_eval(common + extra + ["--out", str(tmp_path / name)]) == 0
        rows[name] = json.loads((tmp_path / name / "eval.json").read_text())
    assert rows["plain"]["expert_start_phase"] is None and rows["plain"]["rows"][0]["grasped_once"] == 0.0
    assert rows["lower"]["expert_start_phase"] == "lower" and rows["lower"]["rows"][0]["grasped_once"] == 1.0
    assert "starts where the scripted expert enters its 'lower' phase" in (tmp_path / "lower" / "eval.md").read_text()
    capsys.readouterr()
    refused = common[:-1] + [json.dumps({**kwargs, "expert_start_phases": ["lower"]})]
    assert vla_eval(refused) == 2
    assert "for training only, never for evaluation" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        vla_eval(common + ["--expert-start-phase", "fly"])
    assert exit_info.value.code == 2 and "--expert-start-phase 'fly': one of" in capsys.readouterr().err


def test_its_model_code_is_the_package_code():
    # save_pretrained copies the model code beside the weights so that transformers' trust_remote_code
    # loads the folder without this package; a change to vla_trainer/models/ must be published again
    # (scripts/make_warm_start.sh, or vla-train publish-warm-start), or the copy runs stale code.
    models = Path(__file__).resolve().parents[2] / "vla_trainer" / "models"
    copies = sorted(SHIPPED_WARM_START.glob("*.py"))
    assert {p.name for p in copies} >= {"config.py", "openvla.py", "oft.py"}
    stale = [p.name for p in copies if p.read_bytes() != (models / p.name).read_bytes()]
    assert not stale, f"warm start model code differs from vla_trainer/models/: {stale}"


@pytest.mark.slow
@pytest.mark.maniskill
def test_the_variant_recipe_records_its_demos_and_continues_the_shipped_warm_start(tmp_path, monkeypatch, capsys):
    """``vla-train warm-start --config tiny_put_on_plate_easy``, shortened: the scripted expert
    recorded on the variant's training half in the RL recipe's scene, one SFT stage from the
    shipped warm start, and a publication that says so."""
    from vla_trainer.cli.train import main as vla_train

    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path / "assets"))
    run, out = tmp_path / "run", tmp_path / "published"
    assert vla_train(["warm-start", "--config", "tiny_put_on_plate_easy", "--out", str(run), "--publish", str(out),
                      "demos.episodes=2", "stages.0.sft.steps=1", "stages.0.sft.eval_samples=4"]) == 0, \
        capsys.readouterr().err
    index = json.loads((run / "demos" / "index.json").read_text())
    assert index["env_id"] == "PutOnPlateInScene25Easy-v3" and len(index["episodes"]) >= 1
    made_by = json.loads((out / "made_by.json").read_text())
    assert made_by["init"] == "the checkpoint warm_start/tiny-openvla-oft-put-on-plate"
    assert made_by["demos"]["env_kwargs"] == dict(load_config("cpu_grpo_tiny_put_on_plate_easy").env.train.env_kwargs)
    assert made_by["demos"]["env_kwargs"] == scene_options(index["env_kwargs"])  # read from what the demos recorded
    model, _ = load_pretrained(out)
    assert model.config.proprio_dim > 0  # the shipped warm start's state input, kept


def test_a_publish_folder_that_would_lose_something_is_refused_before_any_stage(tmp_path, capsys):
    from vla_trainer.cli.train import main as vla_train

    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("mine")
    assert vla_train(["warm-start", "--config", "tiny_put_on_plate_easy", "--out", str(tmp_path / "run"),
                      "--publish", str(notes)]) == 2
    assert "error:" in capsys.readouterr().err and (notes / "todo.txt").read_text() == "mine"
    assert not (tmp_path / "run").exists()  # no demos recorded, no stage run

