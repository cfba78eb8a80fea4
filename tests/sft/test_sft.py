"""Supervised warm start: targets, normalisation, training on synthetic demos, checkpoint, CLI."""

from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
import torch
from synthetic_demos import EPISODES, IMAGE, INSTRUCTIONS, STEPS, expert_action, write_demos
from tiny_vla import tiny  # also sets HF_HUB_OFFLINE and one torch thread

from vla_trainer.cli.train import main as cli_main
from vla_trainer.config.sft import SFTConfig
from vla_trainer.data import action_chunks, build_samples, epoch_pool, release_chunks, resize_images
from vla_trainer.models import VLAPolicy, load_pretrained, unnormalize_actions
from vla_trainer.models.token_targets import gaussian_bin_targets, nll_loss, normalize_actions, target_token_ids
from vla_trainer.sft.train import action_error_by_step, lr_factor, train_sft

PRESET = "tiny-openvla-oft"


def fresh_policy(seed: int = 0) -> VLAPolicy:
    model, tok = tiny(PRESET, seed=seed)
    return VLAPolicy(model, tok)


@pytest.fixture(scope="module")
def demos(tmp_path_factory):
    return write_demos(tmp_path_factory.mktemp("demos"))


@pytest.fixture(scope="module")
def trained(demos, tmp_path_factory):
    policy = fresh_policy()
    out = tmp_path_factory.mktemp("sft") / "ckpt"
    metrics = train_sft(policy, demos, SFTConfig(steps=10, batch_size=8, lr=1e-3, seed=0, log_every=5), out_dir=out,
                        progress=False)
    print("sft metrics:", metrics)
    return policy, metrics, out


# --- targets ---------------------------------------------------------------------------------


def test_action_chunks_pad_with_last_action():
    actions = np.arange(4 * 7, dtype=np.float32).reshape(4, 7)
    chunks = action_chunks(actions, 3)
    assert chunks.shape == (4, 3, 7)
    np.testing.assert_array_equal(chunks[0], actions[0:3])
    np.testing.assert_array_equal(chunks[2], actions[[2, 3, 3]])
    np.testing.assert_array_equal(chunks[3], actions[[3, 3, 3]])
    np.testing.assert_array_equal(action_chunks(actions, 1)[:, 0], actions)


def test_normalize_inverts_unnormalize():
    q01 = torch.tensor([-0.5, 0.0, -2.0, 0.1, -1.0, 0.3, -1.0])
    q99 = torch.tensor([0.5, 2.0, 1.0, 0.2, 1.0, 0.3, 1.0])  # dim 5 degenerate (q01 == q99)
    mask = torch.tensor([True] * 6 + [False])
    a = torch.rand(5, 7) * 1.8 - 0.9
    back = normalize_actions(unnormalize_actions(a, q01, q99, mask), q01, q99, mask)
    keep = torch.ones(7, dtype=torch.bool)
    keep[5] = False
    torch.testing.assert_close(back[:, keep], a[:, keep])
    assert torch.all(back[:, 5] == 0)
    # identity statistics of the tiny presets: a no-op
    policy = fresh_policy()
    chunk = np.linspace(-1, 1, 2 * 7, dtype=np.float32).reshape(1, 2, 7)
    expected = policy.core.action_tokenizer.encode(torch.from_numpy(chunk))
    torch.testing.assert_close(target_token_ids(policy, chunk), expected)


def test_build_samples_and_resize(tmp_path):
    folder = write_demos(tmp_path / "big", image_size=80)
    samples = build_samples(folder, chunk_size=8)
    assert len(samples) == EPISODES * STEPS
    assert samples.image.shape == (EPISODES * STEPS, 80, 80, 3)
    assert samples.action_chunk.shape == (EPISODES * STEPS, 8, 7)
    assert samples.instruction[STEPS] == INSTRUCTIONS[1]
    np.testing.assert_array_equal(samples.action_chunk[STEPS - 1, -1], expert_action(0, STEPS - 1))
    small = resize_images(samples.image[:3], IMAGE)
    assert small.shape == (3, IMAGE, IMAGE, 3) and small.dtype == np.uint8


def test_build_samples_from_several_folders(tmp_path):
    a = write_demos(tmp_path / "a", episodes=2, steps=5)
    b = write_demos(tmp_path / "b", episodes=1, steps=7, seed=1)
    samples = build_samples([a, b], chunk_size=4)
    assert len(samples) == 2 * 5 + 7
    np.testing.assert_array_equal(samples.image[10:], build_samples(b, chunk_size=4).image)
    np.testing.assert_array_equal(samples.action_chunk[:10], build_samples(a, chunk_size=4).action_chunk)


def test_build_samples_from_folders_recorded_at_two_image_sizes(tmp_path):
    small = write_demos(tmp_path / "small", image_size=IMAGE, episodes=1, steps=3)
    large = write_demos(tmp_path / "large", image_size=2 * IMAGE, episodes=1, steps=3)
    samples = build_samples([small, large], chunk_size=2)
    assert samples.image.shape == (6, 2 * IMAGE, 2 * IMAGE, 3)  # the larger size, when no size is asked
    # at the model's size each frame is resized once: the small folder's frames come back as recorded,
    # not blurred by a trip up to the large size and down again
    at_model = build_samples([small, large], chunk_size=2, image_size=IMAGE)
    assert at_model.image.shape == (6, IMAGE, IMAGE, 3)
    np.testing.assert_array_equal(at_model.image[:3], build_samples(small, chunk_size=2).image)


def test_first_frame_repeats_draw_each_episodes_first_frame_that_often(tmp_path):
    a = write_demos(tmp_path / "a", episodes=2, steps=5)
    b = write_demos(tmp_path / "b", episodes=1, steps=7, seed=1)
    samples = build_samples([a, b], chunk_size=4)
    np.testing.assert_array_equal(samples.episode_step, [0, 1, 2, 3, 4] * 2 + list(range(7)))
    assert epoch_pool(samples, 1) == len(samples)  # the plain epoch: same shuffles as before the option
    counts = np.bincount(epoch_pool(samples, 4), minlength=len(samples))
    np.testing.assert_array_equal(np.flatnonzero(counts == 4), [0, 5, 10])
    # a correction's recorded part starts at its hand-over: no first frame of an episode to repeat
    index = json.loads((b / "index.json").read_text())
    index["episodes"][0]["handover_step"] = 8
    (b / "index.json").write_text(json.dumps(index))
    samples = build_samples([a, b], chunk_size=4)
    np.testing.assert_array_equal(samples.episode_step[10:], range(8, 15))
    np.testing.assert_array_equal(np.flatnonzero(np.bincount(epoch_pool(samples, 4)) == 4), [0, 5])
    assert (np.delete(counts, [0, 5, 10]) == 1).all()
    with pytest.raises(ValueError, match="first_frame_repeats=0: an integer >= 1"):
        SFTConfig(steps=1, batch_size=2, lr=1e-3, first_frame_repeats=0)
    m = train_sft(fresh_policy(), a, SFTConfig(steps=1, batch_size=2, lr=1e-3, first_frame_repeats=3, eval_samples=4),
                  progress=False)
    assert m["first_frame_repeats"] == 3  # recorded, so a published warm start says how it was made


def test_an_sft_model_records_the_env_options_of_its_demos_and_serving_reads_them(tmp_path):
    """A crop the demos were recorded with must reach the robot: the served spec reads it back."""
    from vla_envs.demos import EpisodeRecorder
    from vla_trainer.deploy.serve import PolicyService

    a = write_demos(tmp_path / "a", episodes=1, steps=4)
    crop = {"image_size": 64, "camera_crop": [190, 80, 460, 350]}
    for folder in ("b", "c"):
        recorder = EpisodeRecorder(tmp_path / folder, 1, "Synthetic-v0", None, env_kwargs=crop)
        recorder.add({"image": np.zeros((1, 64, 64, 3), np.uint8), "state": np.zeros((1, 9), np.float32)},
                     np.zeros((1, 7), np.float32), np.zeros(1, np.float32), np.ones(1, bool))
        recorder.finish(0, "x", 0, {"success_once": 1.0, "success_at_end": 1.0, "return": 1.0})
    cfg = SFTConfig(steps=1, batch_size=2, lr=1e-3, eval_samples=2)
    train_sft(fresh_policy(), [tmp_path / "b", tmp_path / "c"], cfg, out_dir=tmp_path / "model", progress=False)
    spec = PolicyService(tmp_path / "model").spec
    assert spec.camera_crop == (190, 80, 460, 350) and spec.task == "Synthetic-v0"
    # demos that do not say (or disagree) record nothing: the crop stays unknown, not guessed
    assert train_sft(fresh_policy(), [a, tmp_path / "b"], cfg, progress=False)["env_kwargs"] is None


def test_an_sft_output_records_its_unnorm_key_and_everything_downstream_acts_with_it(demos, tmp_path):
    """A model with several action statistics fine-tuned with one: serving, evaluation, a further SFT
    stage and an RL run from it un-normalise with that one without being told again."""
    from tiny_vla import tiny

    from vla_trainer.build import build_policy
    from vla_trainer.checkpoint import recorded_unnorm_key
    from vla_trainer.cli.eval import unnorm_key
    from vla_trainer.config import load_config
    from vla_trainer.deploy.serve import PolicyService
    from vla_trainer.sft.start import checkpoint_policy, starting_policy

    stats = {k: {"action": {"q01": [-s] * 7, "q99": [s] * 7}} for k, s in (("bridge_orig", 1.0), ("fractal", 0.5))}
    model, tokenizer = tiny(PRESET, norm_stats=stats)
    out = tmp_path / "sft"
    m = train_sft(VLAPolicy(model, tokenizer, unnorm_key="fractal"), demos,
                  SFTConfig(steps=1, batch_size=2, lr=1e-3, eval_samples=4), out_dir=out, progress=False)
    assert m["unnorm_key"] == "fractal" and recorded_unnorm_key(out) == "fractal"
    assert PolicyService(out).policy.unnorm_key == "fractal"
    assert checkpoint_policy(out).unnorm_key == "fractal"
    assert starting_policy(demos, init_from=out).unnorm_key == "fractal"
    assert unnorm_key(argparse.Namespace(unnorm_key=None, recipe_unnorm_key="bridge_orig"), out, model) == "fractal"
    cfg = load_config("cpu_grpo_tiny_put_on_plate", [f"actor.model.model_path={out}", "actor.model.preset=null"])
    assert build_policy(cfg, device="cpu").unnorm_key == "fractal"
    named = load_config("cpu_grpo_tiny_put_on_plate", [f"actor.model.model_path={out}", "actor.model.preset=null",
                                                       "actor.model.unnorm_key=bridge_orig"])
    assert build_policy(named, device="cpu").unnorm_key == "bridge_orig"  # a key the recipe names wins
    (out / "sft_metrics.json").write_text("[not a record")
    assert recorded_unnorm_key(out) is None  # unreadable: nothing recorded, so the model's sets are listed


def test_demo_folders_agree_on_their_scene_whatever_their_contract_options(tmp_path):
    """Demos and corrections of one scene differ in how their envs ran (auto_reset, image size): the
    crop is still recorded. Folders of two crops name the difference, and record no crop."""
    from vla_envs.demos import EpisodeRecorder
    from vla_trainer.data import demos_env

    def folder(name, **env_kwargs):
        recorder = EpisodeRecorder(tmp_path / name, 1, "Synthetic-v0", None, env_kwargs=env_kwargs)
        recorder.add({"image": np.zeros((1, 8, 8, 3), np.uint8), "state": np.zeros((1, 9), np.float32)},
                     np.zeros((1, 7), np.float32), np.zeros(1, np.float32), np.ones(1, bool))
        recorder.finish(0, "x", 0, {"success_once": 1.0, "success_at_end": 1.0, "return": 1.0})
        return tmp_path / name

    crop = [190, 80, 460, 350]
    demos = folder("demos", image_size=64, camera_crop=crop, low_poly=True)
    corrections = folder("corrections", image_size=128, camera_crop=crop, low_poly=True, auto_reset=True)
    assert demos_env([demos, corrections])["env_kwargs"] == {"camera_crop": crop, "low_poly": True}
    other = folder("other", image_size=64, camera_crop=[0, 0, 640, 480], low_poly=True)
    with pytest.warns(UserWarning, match=r"other scene options \(camera_crop: .*demos: \[\[190, 80, 460, 350\]\]"):
        assert demos_env([demos, other])["env_kwargs"] == {"low_poly": True}  # what they agree on
    # real episodes (franka-eval records the crop, not the simulator's options) with simulated demos:
    # the crop both were made with is the model's, recorded so serving crops the real frames alike
    real = folder("real", image_size=64, camera_crop=crop)
    with pytest.warns(UserWarning, match=r"other scene options \(low_poly"):
        assert demos_env([demos, real])["env_kwargs"] == {"camera_crop": crop}


def test_a_warm_start_run_refuses_demos_of_another_scene_than_its_recipe_now_gives(tmp_path):
    """``demos.env_from`` is another recipe, whose scene can change under the same warm-start recipe:
    stages made from demos of the old scene are not continued."""
    from vla_trainer.config.warm_start import load_warm_start
    from vla_trainer.sft.warm_start import claim_run_dir, demo_env_kwargs

    cfg = load_warm_start("tiny_put_on_plate_easy")
    scene = demo_env_kwargs(cfg)
    (tmp_path / "run" / "demos").mkdir(parents=True)
    index = tmp_path / "run" / "demos" / "index.json"
    index.write_text(json.dumps({"format": "vla-demos-v1", "env_id": cfg.demos.env_id, "episodes": [],
                                 "env_kwargs": {**scene, "image_size": 64, "vectorization": "pool"}}))
    claim_run_dir(tmp_path / "run", cfg)  # the same scene, recorded with how the env ran
    index.write_text(json.dumps({"format": "vla-demos-v1", "env_id": cfg.demos.env_id, "episodes": [],
                                 "env_kwargs": {**scene, "camera_crop": [0, 0, 640, 480], "image_size": 64}}))
    with pytest.raises(ValueError, match="demos were recorded with the scene options .*now gives"):
        claim_run_dir(tmp_path / "run", cfg)


def test_release_chunks_mark_the_chunks_that_hold_the_first_opening_after_a_grasp():
    def grip(*g):
        a = np.zeros((len(g), 7), np.float32)
        a[:, 6] = g
        return a

    # opens first at step 5, after the close at 2; chunks of 3 starting at 3, 4, 5 hold it
    np.testing.assert_array_equal(release_chunks(grip(-1, -1, 1, 1, 1, -1, -1, 1, -1), 3),
                                  [0, 0, 0, 1, 1, 1, 0, 0, 0])
    np.testing.assert_array_equal(release_chunks(grip(1, -1, -1), 8), [1, 1, 0])  # clipped at the start
    assert not release_chunks(grip(-1, -1, -1), 3).any()  # never closed
    assert not release_chunks(grip(-1, 1, 1), 3).any()  # never let go


def test_release_frame_repeats_draw_the_release_chunks_that_often(tmp_path):
    a = write_demos(tmp_path / "a", episodes=2, steps=STEPS)  # the gripper opens at step STEPS // 2
    b = write_demos(tmp_path / "b", episodes=1, steps=5, seed=1)  # closed throughout: no release
    samples = build_samples([a, b], chunk_size=4)
    release = [t for e in range(2) for t in range(e * STEPS + STEPS // 2 - 3, e * STEPS + STEPS // 2 + 1)]
    np.testing.assert_array_equal(np.flatnonzero(samples.holds_release), release)
    counts = np.bincount(epoch_pool(samples, 2, 3), minlength=len(samples))
    first = [0, STEPS, 2 * STEPS]
    assert (counts[release] == 3).all() and (counts[first] == 2).all()
    assert (np.delete(counts, release + first) == 1).all()
    with pytest.raises(ValueError, match="release_frame_repeats=0: an integer >= 1"):
        SFTConfig(steps=1, batch_size=2, lr=1e-3, release_frame_repeats=0)
    m = train_sft(fresh_policy(), a, SFTConfig(steps=1, batch_size=2, lr=1e-3, release_frame_repeats=2, eval_samples=4),
                  progress=False)
    assert m["release_frame_repeats"] == 2


# --- training --------------------------------------------------------------------------------


def test_loss_decreases_and_accuracy_increases(trained):
    _, m, _ = trained
    assert m["num_samples"] == EPISODES * STEPS
    assert m["final_loss"] < 0.7 * m["initial_loss"], m
    assert m["final_token_accuracy"] > m["initial_token_accuracy"] + 0.1, m


def test_action_error_is_reported_against_the_zero_action(trained, demos):
    _, m, _ = trained
    chunks = build_samples(demos, chunk_size=trained[0].chunk_size).action_chunk
    assert m["action_l1_of_zero"] == pytest.approx(float(np.abs(chunks).mean()), rel=1e-5)
    assert 0.0 <= m["final_action_l1"] < 2.0


def test_action_error_by_step_separates_steps_and_dimensions(trained, demos):
    policy = trained[0]
    report = action_error_by_step(policy, demos, steps=(0, 5, STEPS))
    assert sorted(report) == [0, 5]  # no episode has a step STEPS
    for t in (0, 5):
        expert = np.stack([expert_action(ep, t) for ep in range(EPISODES)])
        assert report[t]["episodes"] == EPISODES
        np.testing.assert_allclose(report[t]["zero"], np.abs(expert).mean(0), rtol=1e-5)
        # the same observations through the training-sample path: sample ep * STEPS + t
        samples = build_samples(demos, policy.chunk_size)
        idx = np.arange(EPISODES) * STEPS + t
        with torch.no_grad():
            greedy = policy.act(policy.prepare(samples.obs(idx)), greedy=True).actions[:, 0].numpy()
        np.testing.assert_allclose(report[t]["policy"], np.abs(greedy - expert).mean(0), atol=1e-6)


def test_checkpoint_reloads_identically(trained):
    policy, metrics, out = trained
    assert json.loads((out / "sft_metrics.json").read_text())["final_loss"] == metrics["final_loss"]
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp folders left
    model, tok = load_pretrained(out)
    loaded = VLAPolicy(model, tok)
    rng = np.random.default_rng(1)
    obs = {"image": rng.integers(0, 256, (3, IMAGE, IMAGE, 3), dtype=np.uint8),
           "instruction": INSTRUCTIONS}
    tokens = policy.act(obs, greedy=True).action_token_ids
    with torch.no_grad():
        a = policy.evaluate(policy.prepare(obs), tokens, temperature=1.0, top_k=None).log_probs
        b = loaded.evaluate(loaded.prepare(obs), tokens, temperature=1.0, top_k=None).log_probs
    torch.testing.assert_close(a, b, atol=0, rtol=0)


def test_same_seed_same_result(tmp_path):
    small = write_demos(tmp_path / "small", episodes=2, steps=4)  # 8 samples: cheap before/after metrics
    cfg = SFTConfig(steps=2, batch_size=4, lr=1e-3, seed=3)
    runs = [train_sft(fresh_policy(), small, cfg, progress=False) for _ in range(2)]
    assert runs[0]["final_loss"] == runs[1]["final_loss"]
    assert runs[0]["final_loss"] != runs[0]["initial_loss"]


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    steps, warmup = 100, 10
    cosine = [lr_factor(i, steps, warmup, "cosine") for i in range(steps)]
    assert cosine[:warmup] == pytest.approx([(i + 1) / warmup for i in range(warmup)])
    assert cosine[warmup] == pytest.approx(1.0)
    assert cosine[-1] == pytest.approx(0.1)
    assert all(a >= b for a, b in zip(cosine[warmup:], cosine[warmup + 1:]))
    assert cosine[warmup + 45] == pytest.approx(0.55, abs=0.02)  # half way: the mean of 1 and 0.1
    assert [lr_factor(i, steps, 0, "constant") for i in (0, 50, 99)] == [1.0, 1.0, 1.0]


def test_eval_curve_and_schedule_options(tmp_path):
    small = write_demos(tmp_path / "small", episodes=2, steps=4)
    cfg = SFTConfig(steps=4, batch_size=4, lr=1e-3, seed=3, eval_every=2, warmup_steps=2, lr_schedule="cosine")
    m = train_sft(fresh_policy(), small, cfg, progress=False)
    assert [p["step"] for p in m["curve"]] == [2, 4]
    assert m["curve"][-1]["loss"] == m["final_loss"]
    assert set(m["curve"][0]) == {"step", "loss", "token_accuracy", "action_l1", "action_l1_of_zero"}
    with pytest.raises(ValueError, match=r"lr_schedule='linear': one of \('constant', 'cosine'\)"):
        SFTConfig(steps=2, batch_size=4, lr=1e-3, lr_schedule="linear")


def test_gaussian_bin_targets():
    w = gaussian_bin_targets(torch.tensor([[0, 10]]), 21, 2.0)
    assert w.shape == (1, 2, 21)
    torch.testing.assert_close(w.sum(-1), torch.ones(1, 2))
    assert int(w[0, 1].argmax()) == 10 and torch.allclose(w[0, 1, 7], w[0, 1, 13])  # symmetric
    assert w[0, 1, 9] < w[0, 1, 10] and w[0, 1, 5] < w[0, 1, 8]  # falls off with distance
    assert float(w[0, 0, 0]) == pytest.approx(1 / (1 + sum(np.exp(-0.5 * (k / 2) ** 2) for k in range(1, 21))))
    sharp = gaussian_bin_targets(torch.tensor([4]), 9, 1e-3)
    torch.testing.assert_close(sharp, torch.nn.functional.one_hot(torch.tensor([4]), 9).float())


def test_smoothed_loss_is_the_nll_for_a_tiny_sigma_and_lower_for_a_wide_one():
    policy = fresh_policy()
    rng = np.random.default_rng(0)
    obs = {"image": rng.integers(0, 256, (2, IMAGE, IMAGE, 3), dtype=np.uint8), "instruction": INSTRUCTIONS[:2]}
    inputs = policy.prepare(obs)
    tokens = policy.act(inputs, greedy=True).action_token_ids
    with torch.no_grad():
        plain = nll_loss(policy, inputs, tokens)
        # the loss scores tokens as the RL update does
        torch.testing.assert_close(plain, -policy.evaluate(inputs, tokens).log_probs.mean())
        torch.testing.assert_close(nll_loss(policy, inputs, tokens, 1e-4), plain, rtol=1e-5, atol=1e-5)
        # greedy tokens are the most likely bins: spreading the target onto others costs more
        assert nll_loss(policy, inputs, tokens, 5.0) > plain


# --- settings ---------------------------------------------------------------------------------


@pytest.mark.parametrize("field, value, allowed", [
    ("steps", 0, "an integer >= 1"), ("batch_size", 2.0, "an integer >= 1"), ("lr", 0.0, "a learning rate > 0"),
    ("warmup_steps", -1, "an integer >= 0"), ("lr_schedule", "linear", "one of"), ("weight_decay", -0.1, "a number >= 0"),
    ("max_grad_norm", 0.0, "a norm > 0"), ("label_sigma_bins", -1.0, "a number >= 0"), ("scene_loss_weight", -1.0, "a number >= 0"),
    ("first_frame_repeats", True, "an integer >= 1"), ("eval_every", 0, "None or an integer >= 1"),
    ("eval_samples", 0, "None or an integer >= 1"), ("seed", 1.5, "an integer"),
])
def test_settings_refuse_bad_values_naming_the_field(field, value, allowed):
    with pytest.raises(ValueError, match=f"^{field}={value!r}: {allowed}"):
        SFTConfig(**{"steps": 1, "batch_size": 1, "lr": 1e-3, field: value})


def test_the_settings_are_recorded_with_the_metrics(trained):
    _, metrics, out = trained
    expected = SFTConfig(steps=10, batch_size=8, lr=1e-3, seed=0, log_every=5).to_dict()
    assert metrics["settings"] == expected
    assert json.loads((out / "sft_metrics.json").read_text())["settings"] == expected


def test_cli_names_the_flag_of_a_bad_setting(tmp_path, capsys):
    rc = cli_main(["sft", "--demos", str(tmp_path), "--out", str(tmp_path / "out"), "--warmup-steps", "-1"])
    assert rc == 2
    assert "--warmup-steps: warmup_steps=-1: an integer >= 0" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# --- CLI -------------------------------------------------------------------------------------


def test_cli_missing_demo_folder(demos, tmp_path, capsys):
    missing = tmp_path / "no_such_demos"
    rc = cli_main(["sft", "--demos", str(demos), str(missing), "--out", str(tmp_path / "out"), "--steps", "1"])
    assert rc != 0
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag,value", [("--steps", "0"), ("--batch-size", "-2"), ("--lr", "0")])
def test_cli_rejects_non_positive(tmp_path, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        cli_main(["sft", "--demos", str(tmp_path), "--out", str(tmp_path / "out"), flag, value])
    assert e.value.code != 0
    assert "positive" in capsys.readouterr().err


def test_cli_two_steps(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    more = write_demos(tmp_path / "more_demos", episodes=1, steps=3, seed=1)
    out = tmp_path / "cli_ckpt"
    rc = cli_main(["sft", "--demos", str(demos), str(more), "--preset", PRESET, "--steps", "2",
                   "--batch-size", "4", "--lr", "1e-3", "--out", str(out), "--seed", "0"])
    assert rc == 0
    printed = capsys.readouterr().out
    metrics = json.loads(printed[printed.index("{"):])
    assert metrics["steps"] == 2 and metrics["num_samples"] == 4 + 3
    assert (out / "config.json").is_file() and (out / "sft_metrics.json").is_file()
    model, tok = load_pretrained(out)
    assert model.config.chunk_size == 8 and tok is not None


@pytest.mark.reliability(fault="an SFT --out that is a file, a folder of notes or the demos being trained on", cases=3,
                         outcome="refused before training; nothing there changed")
def test_cli_out_never_replaces_what_it_did_not_write(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "notes.txt").write_text("important")
    a_file = tmp_path / "a_file"
    a_file.write_text("important")
    demo_files = sorted(p.name for p in demos.iterdir())
    args = ["sft", "--demos", str(demos), "--preset", PRESET, "--steps", "1", "--batch-size", "4"]
    for out, says in ((notes, "holds notes.txt"), (demos, "holds episode_"), (a_file, "is a file")):
        assert cli_main([*args, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: --out {out}") and says in err, err
    assert (notes / "notes.txt").read_text() == "important" and a_file.read_text() == "important"
    assert sorted(p.name for p in demos.iterdir()) == demo_files
    with pytest.raises(FileExistsError, match="holds notes.txt"):  # the library refuses before training too
        train_sft(fresh_policy(), demos, SFTConfig(steps=1, batch_size=4, lr=1e-3), out_dir=notes, progress=False)

    out = tmp_path / "model"
    for seed in ("0", "1"):  # the same command again replaces its own model folder
        assert cli_main([*args, "--out", str(out), "--seed", seed]) == 0
        assert json.loads((out / "sft_metrics.json").read_text())["settings"]["seed"] == int(seed)


def test_cli_slot_embeddings(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    out = tmp_path / "learned"
    rc = cli_main(["sft", "--demos", str(demos), "--steps", "1", "--batch-size", "4", "--out", str(out),
                   "--slot-embeddings", "learned", "--warmup-steps", "1", "--lr-schedule", "cosine",
                   "--label-sigma-bins", "2", "--eval-every", "1"])
    assert rc == 0
    model, _ = load_pretrained(out)
    assert model.config.slot_embeddings == "learned" and model.action_slots is not None
    assert json.loads((out / "sft_metrics.json").read_text())["curve"][0]["step"] == 1
    assert (out / "sft_curve.png").stat().st_size > 1000
    rc = cli_main(["sft", "--demos", str(demos), "--steps", "1", "--out", str(tmp_path / "x"),
                   "--preset", "tiny-openvla", "--slot-embeddings", "learned"])
    assert rc == 2 and "OpenVLA-OFT presets" in capsys.readouterr().err


def test_cli_patch_positions_on_a_new_model_or_added_to_a_checkpoint_without_one(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    coded, plain, added = tmp_path / "coded", tmp_path / "plain", tmp_path / "added"
    common = ["sft", "--demos", str(demos), "--steps", "1", "--batch-size", "4"]
    assert cli_main(common + ["--out", str(coded), "--patch-positions", "sincos"]) == 0
    model, _ = load_pretrained(coded)
    assert model.config.patch_positions == "sincos" and model.patch_positions is not None
    assert cli_main(common + ["--out", str(plain)]) == 0
    assert load_pretrained(plain)[0].patch_positions is None
    assert cli_main(common + ["--out", str(added), "--init-from", str(plain), "--patch-positions", "sincos"]) == 0
    model, _ = load_pretrained(added)
    assert model.config.patch_positions == "sincos"
    # trained one step from the new model's code
    assert 0 < (model.patch_positions - model.new_patch_code()).abs().max() < 0.05
    capsys.readouterr()
    assert cli_main(common + ["--out", str(tmp_path / "x"), "--init-from", str(coded), "--patch-positions", "none"]) == 2
    assert "has a trained place code" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
    assert cli_main(common + ["--out", str(tmp_path / "y"), "--init-from", str(coded), "--slot-embeddings", "learned"]) == 2
    assert "--slot-embeddings shapes a new model" in capsys.readouterr().err


def test_cli_layout_token_on_a_new_model_or_added_to_a_checkpoint_without_one(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    plain, added = tmp_path / "plain", tmp_path / "added"
    common = ["sft", "--demos", str(demos), "--steps", "1", "--batch-size", "4"]
    assert cli_main(common + ["--out", str(plain)]) == 0
    assert load_pretrained(plain)[0].layout_token is None
    assert cli_main(common + ["--out", str(added), "--init-from", str(plain), "--layout-token", "linear",
                              "--first-frame-repeats", "3", "--release-frame-repeats", "2"]) == 0
    model, _ = load_pretrained(added)
    assert model.config.layout_token == "linear" and model.layout_token is not None
    recorded = json.loads((added / "sft_metrics.json").read_text())
    assert (recorded["first_frame_repeats"], recorded["release_frame_repeats"]) == (3, 2)
    capsys.readouterr()
    assert cli_main(common + ["--out", str(tmp_path / "x"), "--init-from", str(added), "--layout-token", "none"]) == 2
    assert "has a trained layout token" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_cli_proprio_adds_the_robot_state_z_scored_with_the_demos_statistics(tmp_path, capsys):
    from vla_trainer.data import load_episodes, state_stats

    demos = write_demos(tmp_path / "cli_demos", episodes=2, steps=4)
    states = np.concatenate([e["state"] for e in load_episodes(demos)]).astype(np.float64)
    stats = state_stats(demos)
    np.testing.assert_allclose(stats["mean"], states.mean(0))
    np.testing.assert_allclose(stats["std"], np.maximum(states.std(0), 1e-2))
    plain, added = tmp_path / "plain", tmp_path / "added"
    common = ["sft", "--demos", str(demos), "--steps", "2", "--batch-size", "4"]
    assert cli_main(common + ["--out", str(plain)]) == 0
    assert load_pretrained(plain)[0].config.proprio_dim == 0
    assert cli_main(common + ["--out", str(added), "--init-from", str(plain), "--proprio"]) == 0
    model, tok = load_pretrained(added)
    assert model.config.proprio_dim == states.shape[1]
    np.testing.assert_allclose(model.config.proprio_stats["mean"], stats["mean"])
    # SFT trains the projector along with the rest
    policy = fresh_policy()
    policy.core.add_proprio(stats)
    start = [p.detach().clone() for p in policy.core.proprio_projector.parameters()]
    train_sft(policy, demos, SFTConfig(steps=2, batch_size=4, lr=1e-3, seed=0), out_dir=tmp_path / "direct",
              progress=False)
    assert all(not torch.equal(a, b) for a, b in zip(start, policy.core.proprio_projector.parameters()))
    # continuing keeps the input; a policy without the state in its observation is told what is missing
    assert cli_main(common + ["--out", str(tmp_path / "again"), "--init-from", str(added), "--proprio"]) == 0
    assert load_pretrained(tmp_path / "again")[0].config.proprio_dim == states.shape[1]
    obs = {"image": np.zeros((1, 64, 64, 3), np.uint8), "instruction": ("put the carrot on the plate",)}
    with pytest.raises(Exception, match="obs\\['state'\\]"):
        VLAPolicy(model, tok).prepare(obs)


def test_cli_init_from_continues_where_the_checkpoint_left_off(tmp_path, capsys):
    demos = write_demos(tmp_path / "cli_demos", episodes=1, steps=4)
    first, second = tmp_path / "first", tmp_path / "second"
    common = ["sft", "--demos", str(demos), "--batch-size", "4", "--lr", "1e-3"]
    assert cli_main(common + ["--steps", "3", "--out", str(first), "--slot-embeddings", "learned"]) == 0
    assert cli_main(common + ["--steps", "2", "--out", str(second), "--init-from", str(first)]) == 0
    m1 = json.loads((first / "sft_metrics.json").read_text())
    m2 = json.loads((second / "sft_metrics.json").read_text())
    # the continued run starts from the first run's weights, not from a new model
    assert m2["initial_loss"] == pytest.approx(m1["final_loss"], rel=1e-5)
    assert m2["initial_loss"] < m1["initial_loss"] - 0.5
    model, _ = load_pretrained(second)
    assert model.config.slot_embeddings == "learned"
    capsys.readouterr()

    assert cli_main(common + ["--steps", "1", "--out", str(tmp_path / "x"), "--init-from", str(demos)]) == 2
    assert "not a checkpoint folder" in capsys.readouterr().err
    assert cli_main(common + ["--steps", "1", "--out", str(tmp_path / "y"), "--init-from", str(first),
                              "--slot-embeddings", "zeros"]) == 2
    assert "--init-from" in capsys.readouterr().err
    assert not (tmp_path / "x").exists() and not (tmp_path / "y").exists()


def test_cli_sft_report(trained, demos, tmp_path, capsys):
    _, _, ckpt = trained
    out = tmp_path / "report.json"
    assert cli_main(["sft-report", "--checkpoint", str(ckpt), "--demos", str(demos), "--steps", "0,2",
                     "--json", str(out)]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("t=")]
    assert [ln.split()[0] for ln in lines] == ["t=0", "t=2"]
    report = json.loads(out.read_text())
    expert = np.stack([expert_action(ep, 2) for ep in range(EPISODES)])
    np.testing.assert_allclose(report["2"]["zero"], np.abs(expert).mean(0), rtol=1e-5)
    assert f"gripper {report['0']['policy'][6]:.2f}/{report['0']['zero'][6]:.2f}" in lines[0]


def test_cli_sft_report_json_that_cannot_be_written_is_named(trained, demos, tmp_path, capsys):
    (tmp_path / "a_file").write_text("x")
    bad = tmp_path / "a_file" / "report.json"
    assert cli_main(["sft-report", "--checkpoint", str(trained[2]), "--demos", str(demos), "--steps", "0",
                     "--json", str(bad)]) == 1
    captured = capsys.readouterr()
    assert f"error: --json {bad}: cannot be written" in captured.err and "t=0" in captured.out


@pytest.mark.reliability(fault="a damaged demo folder (index not JSON, not an object; an episode not an .npz or cut short)",
                         cases=1, outcome="refused by every stage that reads it, naming the file")
@pytest.mark.parametrize("damage, says", [
    ({"index.json": b"garbage"}, "index.json is not valid JSON"),
    ({"index.json": b"[1, 2]"}, "format 'list', expected 'vla-demos-v1'"),
    ({"episode_000000.npz": b"garbage"}, "episode_000000.npz, an episode that"),
    ({"episode_000000.npz": b"PK\x03\x04cut"}, "episode_000000.npz, an episode that"),
])
def test_a_damaged_demo_folder_is_named_by_every_stage_that_reads_it(tmp_path, capsys, damage, says):
    demos = write_demos(tmp_path / "demos", episodes=2, steps=3)
    for name, data in damage.items():
        (demos / name).write_bytes(data)
    index_damaged = "index.json" in damage  # (these synthetic demos have no scene poses for pretrain-vision)
    for command in (["sft", "--preset", PRESET], *([["pretrain-vision"]] if index_damaged else [])):
        assert cli_main([*command, "--demos", str(demos), "--out", str(tmp_path / "out"), "--steps", "1"]) == 2
        err = capsys.readouterr().err
        assert says in err and "Traceback" not in err, err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--steps", "0,-1"], "--steps"),
    (["--steps", "a"], "--steps"),
    (["--steps", "99"], "no demo episode is that long"),
])
def test_cli_sft_report_rejects_bad_steps(trained, demos, capsys, args, message):
    assert cli_main(["sft-report", "--checkpoint", str(trained[2]), "--demos", str(demos), *args]) == 2
    assert message in capsys.readouterr().err


def test_cli_sft_report_names_an_unknown_unnorm_key_and_the_ones_there_are(trained, demos, capsys):
    assert cli_main(["sft-report", "--checkpoint", str(trained[2]), "--demos", str(demos), "--steps", "0",
                     "--unnorm-key", "no_such_set"]) == 2
    err = capsys.readouterr().err
    assert "no_such_set" in err and "Traceback" not in err, err


def test_cli_sft_report_rejects_a_folder_without_a_model(demos, tmp_path, capsys):
    assert cli_main(["sft-report", "--checkpoint", str(tmp_path), "--demos", str(demos)]) == 2
    err = capsys.readouterr().err
    assert "--checkpoint" in err and "not a checkpoint folder" in err


def test_checkpoint_options_accept_a_training_checkpoint_and_a_run_folder(trained, demos, tmp_path, capsys):
    """--checkpoint takes what vla-eval takes: the model folder, a training checkpoint holding it
    (model/), a run folder, or its checkpoints/latest pointer file (the docs' ros2 launch example),
    and reads the same model from each."""
    import shutil

    model_dir = trained[2]
    run = tmp_path / "run"
    shutil.copytree(model_dir, run / "checkpoints" / "iter_000003" / "model")
    (run / "checkpoints" / "latest").write_text("iter_000003\n")
    reports = []
    for folder in (model_dir, run / "checkpoints" / "iter_000003", run, run / "checkpoints" / "latest"):
        assert cli_main(["sft-report", "--checkpoint", str(folder), "--demos", str(demos), "--steps", "0"]) == 0
        reports.append([ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("t=")])
    assert reports[0] and reports[0] == reports[1] == reports[2] == reports[3]


def test_what_a_stage_adds_to_a_checkpoint_starts_from_its_seed(tmp_path):
    """A continued stage's new layout token and state input start from the stage's seed, whatever an
    earlier stage left in torch's generator: a resumed warm start equals an uninterrupted one."""
    from vla_trainer.sft.start import starting_policy

    demos = write_demos(tmp_path / "demos")
    model, tokenizer = tiny()
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    added = []
    for generator_state in (1, 2):
        torch.manual_seed(generator_state)  # what another stage's training left behind
        policy = starting_policy(demos, init_from=tmp_path / "model", seed=5, layout_token="linear", proprio=True)
        added.append({k: v.clone() for k, v in policy.model.state_dict().items()
                      if k.startswith(("layout_token", "proprio_projector"))})
    assert added[0] and added[0].keys() == added[1].keys()
    for key in added[0]:
        torch.testing.assert_close(added[0][key], added[1][key], rtol=0, atol=0)


def _recorded(folder, episodes, image_size=16):
    """A demo folder of ``episodes``: (actions [T, A], states [T, S], success) each."""
    from vla_envs.demos import EpisodeRecorder

    recorder = EpisodeRecorder(folder, num_envs=1, env_id="Synthetic-v0", asset_pack=None, only_success=False)
    for i, (actions, states, success) in enumerate(episodes):
        for t in range(len(actions)):
            obs = {"image": np.zeros((1, image_size, image_size, 3), np.uint8),
                   "state": np.asarray(states[t], np.float32)[None]}
            recorder.add(obs, np.asarray(actions[t], np.float32)[None], np.zeros(1, np.float32),
                         np.array([t == len(actions) - 1]))
        recorder.finish(0, INSTRUCTIONS[0], i, {"success_once": float(success), "success_at_end": float(success),
                                                "return": 0.0})
    return folder


def test_demos_whose_actions_are_not_7d_are_refused_naming_the_width(tmp_path, capsys):
    """6-D actions raised a raw IndexError in SFT, 8-D ones a RuntimeError deep in the targets."""
    for width in (6, 8):
        demos = _recorded(tmp_path / f"d{width}", [(np.zeros((3, width)), np.zeros((3, 9)), True)])
        assert cli_main(["sft", "--preset", PRESET, "--demos", str(demos), "--out", str(tmp_path / "out"),
                         "--steps", "1"]) == 2
        err = capsys.readouterr().err
        assert f"actions of width [{width}]; the models take 7-D" in err and "Traceback" not in err, err


def test_proprio_statistics_are_those_of_the_episodes_trained_on(tmp_path):
    """Failed episodes are not trained on; the state z-score came from them too (a failure far away
    shifted the mean from 0.2 to 1.9)."""
    from vla_trainer.data import state_stats

    good = [(np.zeros((5, 7)), np.full((5, 3), v), True) for v in (0.1, 0.3)]
    demos = _recorded(tmp_path / "d", [*good, (np.zeros((5, 7)), np.full((5, 3), 5.0), False)])
    stats = state_stats(demos)
    np.testing.assert_allclose(stats["mean"], [0.2] * 3)
    np.testing.assert_allclose(stats["std"], [0.1] * 3)


def test_cli_sft_report_takes_folders_of_two_image_sizes_as_sft_does_and_names_failed_only_folders(
        trained, tmp_path, capsys):
    small, large = write_demos(tmp_path / "a", image_size=IMAGE), write_demos(tmp_path / "b", image_size=2 * IMAGE)
    assert cli_main(["sft-report", "--checkpoint", str(trained[2]), "--demos", str(small), str(large),
                     "--steps", "0"]) == 0
    assert [ln.split()[0] for ln in capsys.readouterr().out.splitlines() if ln.startswith("t=")] == ["t=0"]
    failed = _recorded(tmp_path / "failed", [(np.zeros((3, 7)), np.zeros((3, 9)), False)], image_size=IMAGE)
    assert cli_main(["sft-report", "--checkpoint", str(trained[2]), "--demos", str(failed), "--steps", "0"]) == 2
    assert "holds no successful episodes" in capsys.readouterr().err
