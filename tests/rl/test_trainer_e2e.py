"""End-to-end RL runs on the real CPU ManiSkill PutOnPlate task with the tiny preset:
two PPO and two GRPO iterations, exact resume, resume refused for another config, the CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from vla_trainer.cli.train import main as vla_train
from vla_trainer.config import load_config
from vla_trainer.metrics_log import read_metrics
from vla_trainer.runner import train

pytestmark = [pytest.mark.maniskill, pytest.mark.slow]

SMALL = ["env.train.total_num_envs=2", "algorithm.group_size=2", "env.train.vectorization=serial",
         "rollout.steps_per_rollout=16", "actor.global_batch_size=4", "actor.micro_batch_size=2",
         "runner.progress_bar=false",
         "env.eval.total_num_envs=2", "env.eval.num_episodes=2", "env.eval.vectorization=serial",
         "env.eval.max_episode_steps=16"]


@pytest.fixture(autouse=True)
def _assets(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("VLA_ENVS_ASSET_DIR", str(tmp_path_factory.getbasetemp() / "assets"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _weights(run_dir, iteration):
    """The state dict of a checkpoint's model, loaded as a user would."""
    from vla_trainer.models import load_pretrained

    model, _ = load_pretrained(run_dir / "checkpoints" / f"iter_{iteration:06d}" / "model")
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _initial_weights(cfg):
    from vla_trainer.build import build_policy

    return {k: v.detach().clone() for k, v in build_policy(cfg).model.state_dict().items()}


@pytest.mark.parametrize("recipe,extra", [
    ("cpu_ppo_tiny_put_on_plate", []),
    ("cpu_grpo_tiny_put_on_plate", []),
    ("cpu_grpo_tiny_put_on_plate", ["env.train.env_kwargs.reward_shaping=0.1"]),  # dense: scores differ
])
def test_two_iterations_learn_log_and_checkpoint(recipe, extra, tmp_path):
    cfg = load_config(recipe, [*SMALL, "runner.max_epochs=2", "runner.val_check_interval=2", "runner.save_interval=1",
                               *extra])
    learns = recipe.startswith("cpu_ppo") or bool(extra)
    result = train(cfg, run_dir=tmp_path / "run")
    run = result.run_dir
    assert result.iterations == 2 and result.env_steps == 2 * 2 * 16

    records = read_metrics(run)
    per_iter = [r for r in records if r["iteration"] > 0]
    assert [r["iteration"] for r in per_iter] == [1, 2]
    for r in per_iter:
        if learns:
            assert np.isfinite(r["actor/policy_loss"]) and np.isfinite(r["actor/grad_norm"])
        else:  # no signal: the update was skipped
            assert r["actor/no_signal"] == 1.0 and "actor/policy_loss" not in r
        assert r["time/generation"] > 0 and r["time/simulation"] > 0 and r["throughput/env_frames_per_s"] > 0
        if recipe.startswith("cpu_ppo"):
            assert np.isfinite(r["critic/value_loss"])
    assert "eval/success_once" in records[0] and "eval/success_at_end" in per_iter[-1]
    assert 0.0 <= per_iter[-1]["eval/grasped_once"] <= 1.0  # the task's partial success, logged beside it
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))
    assert (run / "success_curve.png").stat().st_size > 0

    meta = json.loads((run / "checkpoints" / "iter_000002" / "meta.json").read_text())
    assert meta["iteration"] == 2 and meta["asset_pack"] == "procedural"
    assert (run / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    before, after = _initial_weights(cfg), _weights(run, 2)
    changed = [k for k in after if not torch.equal(before[k], after[k])]
    if learns:
        assert changed, f"two iterations of {recipe} {extra} changed no parameter"
    else:
        # GRPO with the reference reward: a random tiny policy earns none, so every group's scores
        # are equal, every advantage is 0 and the policy must stay exactly as it was
        assert all(r["grpo/score_mean"] == 0 for r in per_iter) and not changed


def test_a_policy_that_reads_the_robot_state_trains_on_the_states_it_saw(tmp_path):
    """PPO from a model with a state input: rollouts keep ``obs["state"]`` and the update reads it
    (a rollout without it fails in the update), so the state projector learns with the rest."""
    from vla_trainer.models import build_model

    model, tok = build_model("tiny-openvla-oft", seed=0)
    model.add_proprio({"mean": [0.0] * 16, "std": [1.0] * 16})  # Panda: 9 joints + TCP pose (7)
    model.save_pretrained(tmp_path / "init")
    tok.save_pretrained(tmp_path / "init")
    cfg = load_config("cpu_ppo_tiny_put_on_plate", [*SMALL, "runner.max_epochs=1", "runner.val_check_interval=1",
                                                    f"actor.model.model_path={tmp_path / 'init'}"])
    run = train(cfg, run_dir=tmp_path / "run").run_dir
    records = read_metrics(run)
    assert np.isfinite(records[-1]["actor/policy_loss"]) and "eval/success_once" in records[-1]
    before, after = _initial_weights(cfg), _weights(run, 1)
    assert after["proprio_projector.0.weight"].shape == (model.config.text_config.hidden_size, 16)
    assert not torch.equal(before["proprio_projector.0.weight"], after["proprio_projector.0.weight"])


def test_grpo_without_reward_learns_from_demos_with_the_bc_term(tmp_path):
    """The same no-reward GRPO run with algorithm.bc_coef: every update now steps, on the demos."""
    from synthetic_demos import write_demos

    demos = write_demos(tmp_path / "demos")
    cfg = load_config("cpu_grpo_tiny_put_on_plate", [*SMALL, "runner.max_epochs=2", "runner.val_check_interval=-1",
                                                     "algorithm.bc_coef=1.0", f"algorithm.bc_demo_dirs=[{demos}]"])
    run = train(cfg, run_dir=tmp_path / "run").run_dir
    per_iter = [r for r in read_metrics(run) if r["iteration"] > 0]
    assert all(r["grpo/score_mean"] == 0 and r["actor/trained"] == 1.0 and np.isfinite(r["actor/bc_nll"])
               for r in per_iter)
    before, after = _initial_weights(cfg), _weights(run, 2)
    assert any(not torch.equal(before[k], after[k]) for k in after)


def test_resume_continues_exactly_and_refuses_another_config(tmp_path):
    base = [*SMALL, "runner.val_check_interval=-1", "runner.save_interval=1", "runner.max_epochs=2"]
    straight = train(load_config("cpu_ppo_tiny_put_on_plate", base), run_dir=tmp_path / "a")
    # a copy of the run resumed from its first checkpoint: iteration 2 is run again
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    first = tmp_path / "b" / "checkpoints" / "iter_000001"
    resumed = train(load_config("cpu_ppo_tiny_put_on_plate", [*base, f"runner.resume_dir={first}"]),
                    run_dir=tmp_path / "b")
    assert resumed.iterations == 2
    assert [r["iteration"] for r in read_metrics(resumed.run_dir)] == [1, 2]  # the re-run record replaced
    # the abandoned iteration's checkpoint and records are kept aside, not left among the run's own
    aside, = (tmp_path / "b" / "checkpoints").glob("abandoned_after_iter_000001_*")
    assert (aside / "iter_000002" / "trainer_state.pt").is_file()
    assert [r["iteration"] for r in read_metrics(aside)] == [1, 2]
    assert (tmp_path / "b" / "checkpoints" / "latest").read_text().strip() == "iter_000002"
    # model, optimizer and generators come from the checkpoint; the env is fresh while the straight
    # run's had run an iteration (CPU PhysX keeps contact history across resets, which moves a few
    # pixels of the first frames), so the result matches to float tolerance
    a1, a, b = _weights(straight.run_dir, 1), _weights(straight.run_dir, 2), _weights(resumed.run_dir, 2)
    assert a.keys() == b.keys() and any(not torch.equal(a1[k], a[k]) for k in a)
    for k in a:
        torch.testing.assert_close(b[k], a[k], rtol=0, atol=1e-5)
    ra, rb = read_metrics(straight.run_dir)[-1], read_metrics(resumed.run_dir)[-1]
    assert ra["env_steps"] == rb["env_steps"] == 64
    assert ra["actor/policy_loss"] == pytest.approx(rb["actor/policy_loss"], abs=1e-4)

    # a new run starts from what vla-eval --checkpoint takes: the run folder (its latest checkpoint)
    started = _initial_weights(load_config("cpu_ppo_tiny_put_on_plate",
                                           [*base, f"actor.model.model_path={tmp_path / 'a'}"]))
    assert all(torch.equal(a[k], started[k]) for k in a)
    with pytest.raises(ValueError, match=r"holds an earlier run \(its latest checkpoint: iter_000002\); continue it"):
        train(load_config("cpu_ppo_tiny_put_on_plate", base), run_dir=tmp_path / "a")  # a new run over it
    assert all(torch.equal(a[k], v) for k, v in _weights(straight.run_dir, 2).items())
    with pytest.raises(ValueError, match=r"actor\.optim\.lr"):
        train(load_config("cpu_ppo_tiny_put_on_plate", [*base, "runner.max_epochs=3", "runner.resume_dir=auto",
                                                         "actor.optim.lr=0.5"]), run_dir=tmp_path / "b")
    # the refused resume left the last good checkpoint as it was
    assert all(torch.equal(b[k], v) for k, v in _weights(resumed.run_dir, 2).items())
    # a run that died before its first checkpoint left its records: the command run again replaces them
    shutil.copytree(tmp_path / "a", tmp_path / "c", ignore=shutil.ignore_patterns("checkpoints"))
    again = train(load_config("cpu_ppo_tiny_put_on_plate", [*base, "runner.max_epochs=1"]), run_dir=tmp_path / "c")
    assert [r["iteration"] for r in read_metrics(again.run_dir)] == [1]
    # another run's checkpoint continued in a folder that holds a run would mix the two: refused
    other = again.run_dir / "checkpoints" / "iter_000001"
    with pytest.raises(ValueError, match=r"holds an earlier run .* to continue .*iter_000001 in"):
        train(load_config("cpu_ppo_tiny_put_on_plate", [*base, f"runner.resume_dir={other}"]), run_dir=tmp_path / "a")
    # a wall-time budget already spent: resuming trains (and saves) nothing more
    spent = train(load_config("cpu_ppo_tiny_put_on_plate", [*base, "runner.max_epochs=3", "runner.resume_dir=auto",
                                                            "runner.max_wall_minutes=1e-6"]), run_dir=tmp_path / "a")
    assert spent.iterations == 2 and spent.checkpoint.name == "iter_000002"
    assert sorted(p.name for p in (tmp_path / "a" / "checkpoints").glob("iter_*")) == ["iter_000001", "iter_000002"]
    # a record cut by a crash (the last line half-written) is left out, not a resume-stopping error
    with open(tmp_path / "a" / "metrics.jsonl", "a") as f:
        f.write('{"iteration": 3, "env_st')
    with pytest.warns(UserWarning, match="its last line is cut off"):
        assert [r["iteration"] for r in read_metrics(tmp_path / "a")] == [1, 2]


def test_cli_errors_name_the_key_and_print_config(capsys, tmp_path):
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "algorithm.adv_type=ppo"]) == 2
    assert "algorithm.adv_type" in capsys.readouterr().err
    assert vla_train(["--config", "no_such_recipe"]) == 2
    assert "cpu_ppo_tiny_put_on_plate" in capsys.readouterr().err
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--print-config", "actor.optim.lr=2e-5"]) == 0
    assert "lr: 2.0e-05" in capsys.readouterr().out
    # one part as JSON, which the scripts read (e.g. the scene options the demos are recorded in)
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--print-config", "env.train.env_kwargs"]) == 0
    assert json.loads(capsys.readouterr().out) == {"low_poly": True, "assets": "procedural",
                                                   "camera_crop": [190, 80, 460, 350], "native_render": False}
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--print-config", "env.train.kwargs"]) == 2
    assert "env.train has no key 'kwargs'; its keys: task," in capsys.readouterr().err
    # into a list by index, as overrides reach it
    crop = "env.train.env_kwargs.camera_crop"
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--print-config", f"{crop}.2"]) == 0
    assert json.loads(capsys.readouterr().out) == 460
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--print-config", f"{crop}.4"]) == 2
    assert "env.train.env_kwargs.camera_crop has no key '4'; its keys: 0, 1, 2, 3" in capsys.readouterr().err
    assert vla_train(["recipes"]) == 0
    assert "maniskill_ppo_openvlaoft" in capsys.readouterr().out
    bad = [*SMALL, "runner.max_epochs=1", "actor.global_batch_size=3", "actor.micro_batch_size=1"]
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(tmp_path / "r"), *bad]) == 2
    assert "actor.global_batch_size" in capsys.readouterr().err
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for args, says in ((["--run-dir", str(a_file)], f"the run folder {a_file} is a file"),
                       ([f"actor.model.model_path={a_file}"], f"{a_file} is a file: a model is a folder"),
                       (["env.train.task=PutOnPlateInScene25Main-v4"], "env.train.task: unknown env id")):
        assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(tmp_path / "r"), *args]) == 2
        assert says in capsys.readouterr().err
    assert a_file.read_text() == "x"
    # a run folder under a file: named before anything is built, no traceback
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(a_file / "sub")]) == 2
    assert f"the run folder {a_file / 'sub'} cannot be made" in capsys.readouterr().err
    # overrides on both sides of an option: all taken (the ones after it were "unrecognized arguments")
    assert vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "runner.max_epochs=1", "--run-dir",
                      str(tmp_path / "r"), *bad]) == 2
    assert "actor.global_batch_size" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        vla_train(["--config", "cpu_ppo_tiny_put_on_plate", "--run-dir", str(tmp_path / "r"), "--bogus"])
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err


def test_lora_trains_only_adapters_and_value_head_and_resumes(tmp_path, capsys):
    from safetensors.torch import load_file

    base = [*SMALL, "actor.model.is_lora=true", "actor.model.lora_rank=4", "runner.val_check_interval=-1",
            "runner.save_interval=1", "runner.max_epochs=1"]
    result = train(load_config("cpu_ppo_tiny_put_on_plate", base), run_dir=tmp_path / "run")
    saved = result.run_dir / "checkpoints" / "iter_000001" / "model"
    assert (saved / "adapter_model.safetensors").is_file() and not (saved / "model.safetensors").exists()
    weights = load_file(saved / "adapter_model.safetensors")
    lora_b = [v for k, v in weights.items() if "lora_B" in k]
    assert lora_b and any(v.abs().max() > 0 for v in lora_b)  # adapters start at B = 0: they trained
    assert any("value_head" in k for k in weights)  # the critic is saved with the adapters
    resumed = train(load_config("cpu_ppo_tiny_put_on_plate", [*base, "runner.max_epochs=2", "runner.resume_dir=auto"]),
                    run_dir=tmp_path / "run")
    assert resumed.iterations == 2
    # adapters alone are no model to start a run from: said at once, no run folder made
    with pytest.raises(FileNotFoundError, match=r"actor\.model\.model_path=.*holds LoRA adapters.*export_merged"):
        train(load_config("cpu_ppo_tiny_put_on_plate", [*base, f"actor.model.model_path={result.run_dir}"]),
              run_dir=tmp_path / "from_adapters")
    assert not (tmp_path / "from_adapters").exists()
    _lora_run_loads_merged_onto_its_base(tmp_path, result.run_dir / "checkpoints" / "iter_000001",
                                         load_config("cpu_ppo_tiny_put_on_plate", base), weights, capsys)


def _lora_run_loads_merged_onto_its_base(tmp_path, checkpoint, cfg, adapters, capsys):
    """``vla-eval`` and every ``--checkpoint`` reader take a LoRA checkpoint: its adapters merged
    into the base model its config.yaml names; a missing or different base is a clear error."""
    import yaml

    from vla_trainer.build import load_model
    from vla_trainer.cli.eval import main as vla_eval
    from vla_trainer.models import AdapterMismatchError, build_model

    merged, _, where = load_model(checkpoint)
    assert where == checkpoint / "model" and not hasattr(merged, "get_base_model")
    torch.manual_seed(cfg.actor.seed)
    base_model, _ = build_model(cfg.actor.model.preset, seed=cfg.actor.seed)
    trained = [k[:-len(".lora_B.weight")] for k, v in adapters.items() if k.endswith("lora_B.weight") and v.any()]
    layer = trained[0].removeprefix("base_model.model.")
    lora_a, lora_b = adapters[f"{trained[0]}.lora_A.weight"], adapters[f"{trained[0]}.lora_B.weight"]
    expected = base_model.get_submodule(layer).weight + lora_b @ lora_a  # lora_alpha = rank: scale 1
    torch.testing.assert_close(merged.get_submodule(layer).weight, expected)

    kwargs = {"low_poly": True, "time_limit": 8, "camera_crop": [190, 80, 460, 350]}
    assert vla_eval(["--checkpoint", str(checkpoint.parent.parent), "--num-envs", "1", "--num-episodes", "1",
                     "--vectorization", "serial", "--env-kwargs", json.dumps(kwargs),
                     "--out", str(tmp_path / "eval")]) == 0
    assert json.loads((tmp_path / "eval" / "eval.json").read_text())["checkpoint"].endswith("model")

    def moved(name, change):
        copy = shutil.copytree(checkpoint, tmp_path / name)
        recipe = yaml.safe_load((copy / "config.yaml").read_text())
        change(recipe)
        (copy / "config.yaml").write_text(yaml.safe_dump(recipe))
        return copy

    missing = moved("missing_base", lambda r: r["actor"]["model"].update(model_path=str(tmp_path / "gone")))
    with pytest.raises(FileNotFoundError, match="actor.model.model_path=.*gone"):
        load_model(missing)
    other = moved("other_base", lambda r: r["actor"].update(seed=cfg.actor.seed + 1))
    with pytest.raises(AdapterMismatchError, match="trained on another base model"):
        load_model(other)
    assert vla_eval(["--checkpoint", str(other), "--num-envs", "1", "--num-episodes", "1"]) == 2
    assert "trained on another base model" in capsys.readouterr().err
