"""Vision pretraining: targets from poses, learning where a body is, what it leaves alone, CLI."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from tiny_vla import tiny  # also sets HF_HUB_OFFLINE and one torch thread

from vla_envs.demos import EpisodeRecorder
from vla_trainer.cli.train import main as cli_main
from vla_trainer.config.sft import SFTConfig
from vla_trainer.data import scene_targets
from vla_trainer.models import VLAPolicy, load_pretrained
from vla_trainer.sft.heads import SlotHead, scene_errors
from vla_trainer.sft.train import train_sft
from vla_trainer.sft.vision import load_scene_frames, pretrain_vision

IMAGE, BODIES = 64, ("object",)


def yaw_quat(yaw: float) -> np.ndarray:
    return np.array([np.cos(yaw / 2), 0.0, 0.0, np.sin(yaw / 2)])


def write_scene_demos(folder, episodes: int = 24, steps: int = 6, seed: int = 0, bodies=BODIES):
    """Frames of a white 10 px square on grey at a random place; the scene pose says where (x, y in
    [-0.1, 0.1] m map to the square's column and row)."""
    rng = np.random.default_rng(seed)
    recorder = EpisodeRecorder(folder, num_envs=1, env_id="Synthetic-v0", asset_pack=None, scene_bodies=bodies)
    for ep in range(episodes):
        for _ in range(steps):
            xy = rng.uniform(-0.1, 0.1, 2)
            col, row = ((xy + 0.1) / 0.2 * (IMAGE - 10)).astype(int)
            image = np.full((1, IMAGE, IMAGE, 3), 90, np.uint8)
            image[0, row : row + 10, col : col + 10] = 255
            pose = np.concatenate([[xy[0], xy[1], 0.02], yaw_quat(0.0)] * len(bodies))[None].astype(np.float32)
            recorder.add({"image": image, "state": np.zeros((1, 3), np.float32)}, np.zeros((1, 7), np.float32),
                         np.zeros(1, np.float32), np.array([False]), pose)
        recorder.finish(0, "put the square down", ep, {"success_once": 1.0, "success_at_end": 1.0, "return": 1.0})
    return folder


def write_plain_demos(folder):
    """One one-step episode recorded without scene poses (not by a scripted expert)."""
    recorder = EpisodeRecorder(folder, num_envs=1, env_id="Synthetic-v0", asset_pack=None)
    recorder.add({"image": np.zeros((1, 8, 8, 3), np.uint8), "state": np.zeros((1, 3), np.float32)},
                 np.zeros((1, 7)), np.zeros(1), np.zeros(1, bool))
    recorder.finish(0, "x", 0, {"success_once": 1.0, "success_at_end": 1.0, "return": 1.0})
    return folder


def test_scene_targets_are_positions_and_the_doubled_yaw():
    poses = np.stack([np.concatenate([[0.1, -0.2, 0.3], yaw_quat(y)]) for y in (0.0, np.pi / 4, np.pi / 2, np.pi)])
    t = scene_targets(poses)
    assert t.shape == (4, 5)
    np.testing.assert_allclose(t[:, :3], [[0.1, -0.2, 0.3]] * 4, atol=1e-6)
    np.testing.assert_allclose(t[:, 3:], [[1, 0], [0, 1], [-1, 0], [1, 0]], atol=1e-6)  # a half turn looks the same
    with pytest.raises(ValueError, match="7 per body"):
        scene_targets(np.zeros((2, 8)))


def test_scene_errors_in_cm_and_degrees():
    target = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0]])
    pred = torch.tensor([[0.03, 0.04, 0.0, 0.0, 1.0]])  # 5 cm off; doubled angle 90 deg = 45 deg of yaw
    errors = scene_errors(pred, target, ["object.x", "object.y", "object.z", "object.cos2yaw", "object.sin2yaw"])
    assert errors == pytest.approx({"object_cm": 5.0, "object_yaw_deg": 45.0})


def test_slot_head_reads_the_slots_as_a_set():
    torch.manual_seed(0)
    head = SlotHead(dim=32, num_bodies=3, targets_per_body=5)
    slots = torch.randn(4, 16, 32)
    out = head(slots)
    assert out.shape == (4, 15)
    torch.testing.assert_close(head(slots[:, torch.randperm(16)]), out)
    assert not torch.allclose(head(slots.flip(0)), out)  # it does depend on the content


def test_recorder_checks_scene_shape(tmp_path):
    recorder = EpisodeRecorder(tmp_path / "d", num_envs=1, env_id="Synthetic-v0", asset_pack=None,
                               scene_bodies=("object", "plate"))
    obs = {"image": np.zeros((1, 8, 8, 3), np.uint8), "state": np.zeros((1, 3), np.float32)}
    with pytest.raises(ValueError, match="expected \\(1, 14\\)"):
        recorder.add(obs, np.zeros((1, 7)), np.zeros(1), np.zeros(1, bool), np.zeros((1, 7)))
    with pytest.raises(ValueError, match="scene poses must be given"):
        recorder.add(obs, np.zeros((1, 7)), np.zeros(1), np.zeros(1, bool))


def test_pretraining_learns_where_the_square_is_and_leaves_the_language_model_alone(tmp_path):
    demos = write_scene_demos(tmp_path / "demos")
    model, tok = tiny("tiny-openvla-oft", seed=0)
    policy = VLAPolicy(model, tok)
    llm_before = {k: v.clone() for k, v in policy.core.language_model.state_dict().items()}
    vision_before = policy.core.vision_backbone.state_dict()["featurizer.embeddings.patch_embeddings.projection.weight"].clone()
    metrics = pretrain_vision(policy, demos, steps=30, batch_size=32, lr=1e-3, eval_every=15,
                              out_dir=tmp_path / "ckpt", progress=False)
    print(json.dumps(metrics["val_after"]), json.dumps(metrics["val_of_mean"]))
    assert metrics["num_val_frames"] == 2 * 6 and metrics["targets"][:2] == ["object.x", "object.y"]
    # held-out frames: far better than predicting the mean position (about 8 cm off); 30 steps
    # reach about 2.2 cm here (60: 1.2, 90: 0.7)
    assert metrics["val_after"]["object_cm"] < 0.5 * metrics["val_of_mean"]["object_cm"]
    assert all(torch.equal(v, llm_before[k]) for k, v in policy.core.language_model.state_dict().items())
    assert not torch.equal(vision_before, policy.core.vision_backbone.state_dict()[
        "featurizer.embeddings.patch_embeddings.projection.weight"])
    reloaded, _ = load_pretrained(tmp_path / "ckpt")
    for k, v in reloaded.vision_backbone.state_dict().items():
        torch.testing.assert_close(v, policy.core.vision_backbone.state_dict()[k])


def test_demos_without_scene_poses_are_refused(tmp_path):
    folder = write_plain_demos(tmp_path / "plain")
    with pytest.raises(ValueError, match="scene_bodies"):
        load_scene_frames(folder, 64)
    other = write_scene_demos(tmp_path / "other", episodes=2, steps=2, bodies=("object", "plate"))
    with pytest.raises(ValueError, match="differ"):
        load_scene_frames([write_scene_demos(tmp_path / "one", episodes=2, steps=2), other], 64)


def test_cli_pretrain_then_sft_init_from(tmp_path, capsys):
    demos = write_scene_demos(tmp_path / "demos", episodes=4, steps=3)
    assert cli_main(["pretrain-vision", "--demos", str(demos), "--steps", "2", "--batch-size", "4",
                     "--slot-embeddings", "learned", "--out", str(tmp_path / "vision")]) == 0
    printed = capsys.readouterr().out  # progress lines, then the metrics
    metrics = json.loads(printed[printed.index("{"):])
    assert metrics["steps"] == 2 and (tmp_path / "vision" / "vision_metrics.json").is_file()
    assert cli_main(["sft", "--demos", str(demos), "--init-from", str(tmp_path / "vision"), "--steps", "1",
                     "--batch-size", "2", "--out", str(tmp_path / "sft")]) == 0
    assert (tmp_path / "sft" / "config.json").is_file()
    demo_files = sorted(p.name for p in demos.iterdir())
    assert cli_main(["pretrain-vision", "--demos", str(demos), "--steps", "2", "--out", str(demos)]) == 2
    assert "holds episode_" in capsys.readouterr().err and sorted(p.name for p in demos.iterdir()) == demo_files


def test_sft_with_a_scene_loss_discards_its_head_and_refuses_demos_without_poses(tmp_path):
    """The scene loss is computed and reported, its head is discarded and the checkpoint is a plain
    policy. (That it teaches the slots where things are is not shown here: on these squares, where
    2 of the 5 z-scored targets vary, predicting the mean scores 0.40, and 60 steps end at 0.40; on
    PutOnPlate the warm start's stages bring it from 0.95 to 0.15-0.22, ``made_by.json``.)"""
    demos = write_scene_demos(tmp_path / "demos", episodes=4, steps=3)
    model, tok = tiny("tiny-openvla-oft", seed=0)
    policy = VLAPolicy(model, tok)
    cfg = SFTConfig(steps=2, batch_size=4, lr=1e-3, log_every=1, scene_loss_weight=1.0)
    metrics = train_sft(policy, demos, cfg, out_dir=tmp_path / "sft", progress=False)
    assert metrics["scene_loss_weight"] == 1.0 and 0 < metrics["final_scene_loss"] < 10
    reloaded, _ = load_pretrained(tmp_path / "sft")
    assert not any("scene" in name for name in reloaded.state_dict())
    plain = write_plain_demos(tmp_path / "plain")
    with pytest.raises(ValueError, match="scene poses"):
        train_sft(policy, plain, SFTConfig(steps=1, batch_size=1, lr=1e-3, scene_loss_weight=1.0), progress=False)


def test_cli_pretrain_rejects_plain_demos(tmp_path, capsys):
    folder = write_plain_demos(tmp_path / "plain")
    assert cli_main(["pretrain-vision", "--demos", str(folder), "--steps", "2", "--out", str(tmp_path / "v")]) == 2
    assert "no scene poses" in capsys.readouterr().err and not (tmp_path / "v").exists()


def test_a_warm_start_recipe_runs_its_stages_resumes_and_publishes(tmp_path, capsys):
    """``vla-train warm-start --config RECIPE --out RUN --publish`` (what ``make_warm_start.sh`` runs):
    vision pretraining and two SFT stages from a recipe (the demos already recorded), a run started
    again skips its whole stages, a run folder of another recipe is refused, and the publication
    has float16 weights, made_by.json built from the stages' own records and one curve."""
    from safetensors.torch import load_file

    run, out = tmp_path / "run", tmp_path / "published"
    write_scene_demos(run / "demos", episodes=10, steps=3)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"""
preset: tiny-openvla-oft
demos: {{env_id: Synthetic-v0, episodes: 12, seed: 3, env_from: cpu_ppo_tiny_put_on_plate}}
vision: {{steps: 2, batch_size: 4, lr: 1.0e-3, eval_every: 1}}
stages:
  - patch_positions: sincos
    sft: {{steps: 2, batch_size: 4, lr: 1.0e-3, eval_every: 1, eval_samples: 8}}
  - proprio: true
    sft: {{steps: 3, batch_size: 4, lr: 5.0e-4, seed: 1, eval_every: 1, eval_samples: 8}}
publish_to: {out}
""")
    args = ["warm-start", "--config", str(recipe), "--out", str(run)]
    assert cli_main([*args, "--publish"]) == 0, capsys.readouterr().err
    made_by = json.loads((out / "made_by.json").read_text())
    assert made_by["command"] == f"vla-train warm-start --config {recipe}"
    assert made_by["demos"] == {"env_id": "Synthetic-v0", "asset_pack": None, "episodes_recorded": 12,
                                "episodes_kept": 10, "seed": 3, "expert_kwargs": {},
                                "env_kwargs": {"low_poly": True, "assets": "procedural",
                                               "camera_crop": [190, 80, 460, 350], "native_render": False}}
    assert made_by["vision_pretraining"]["settings"]["batch_size"] == 4 and made_by["vision_pretraining"]["steps"] == 2
    first, second = made_by["stages"]
    assert (first["settings"]["init"], second["settings"]["init"]) == ("vision pretraining", "stage 0")
    assert first["settings"]["patch_positions"] == "sincos" and not first["settings"]["proprio"]
    assert (second["settings"]["lr"], second["settings"]["seed"], second["steps"]) == (5e-4, 1, 3)
    assert second["settings"]["proprio"]
    weights = load_file(str(out / "model.safetensors"))
    assert all(w.dtype == torch.float16 for w in weights.values() if w.is_floating_point())
    assert (out / "sft_curve.png").is_file() and not (out / "sft_metrics.json").exists()
    # started again: nothing is retrained but the stage that is gone
    kept = {name: (run / name / "model.safetensors").stat().st_mtime_ns for name in ("vision", "sft_0")}
    shutil.rmtree(run / "sft_1")
    assert cli_main(args) == 0
    assert {name: (run / name / "model.safetensors").stat().st_mtime_ns for name in kept} == kept
    assert (run / "sft_1" / "config.json").is_file()
    assert "SFT stage 2 of 2" in capsys.readouterr().out
    # the same folder with other settings would mix two recipes' stages
    assert cli_main([*args, "stages.1.sft.steps=4"]) == 2
    assert "made with another recipe" in capsys.readouterr().err
    assert cli_main(["publish-warm-start", "--run", str(run), "--to", str(tmp_path / "again")]) == 0
    shutil.rmtree(run / "sft_0")
    assert cli_main(["publish-warm-start", "--run", str(run), "--to", str(tmp_path / "again")]) == 2
    assert "sft_0" in capsys.readouterr().err
