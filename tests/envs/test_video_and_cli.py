"""The video recorder, the registry and the ``vla-envs`` CLI."""

from __future__ import annotations

import functools
import json
from pathlib import Path

import imageio.v2 as imageio
import numpy as np
import pytest
from toy_env import ToyEnv

import vla_envs
from vla_envs.cli import main
from vla_envs.core import ChunkVectorEnv
from vla_envs.core.serial import SerialBackend
from vla_envs.errors import BackendNotInstalledError, VlaEnvError
from vla_envs.registry import TASKS, TaskSpec, get_task, register_all
from vla_envs.wrappers import RecordVideo, tile_frames


def test_tile_frames_grid_and_sizes():
    imgs = np.stack([np.full((8, 8, 3), 40 * i, np.uint8) for i in range(5)])
    frame = tile_frames(imgs, None, min_tile=16)
    assert frame.shape == (32, 48, 3)  # 2 rows x 3 cols of 16 px tiles
    assert frame[0, 0, 0] == 0 and frame[0, 16, 0] == 40 and frame[16, 16, 0] == 160


def test_record_video_writes_every_sub_step(tmp_path):
    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)] * 3))
    path = tmp_path / "v" / "rollout.mp4"
    rec = RecordVideo(env, path, fps=5)
    rec.reset(seed=0)
    a = np.zeros((3, 3, 7), np.float32)
    a[1, 1, 6] = 1.0
    for _ in range(2):
        out = rec.chunk_step(a)
    assert out.rewards.shape == (3, 3)
    rec.close()
    assert env.closed
    reader = imageio.get_reader(path, format="FFMPEG")
    assert reader.count_frames() == 1 + 2 * 3  # reset + every sub-step
    h, w = reader.get_meta_data()["size"]
    assert h % 16 == 0 and w % 16 == 0

    rec = RecordVideo(ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)] * 3)), path, max_frames=4)
    rec.reset(seed=0)
    with pytest.warns(UserWarning, match="ends at max_frames=4; the rollout goes on unrecorded"):
        for _ in range(2):
            rec.chunk_step(a)
    rec.close()
    assert rec.frames_written == 4 and imageio.get_reader(path, format="FFMPEG").count_frames() == 4


@pytest.mark.parametrize("chunk_reset", ["end_of_chunk", "immediate"])
def test_the_overlay_counts_each_auto_reset_episode_from_its_first_step(tmp_path, chunk_reset):
    """Episodes of 3 steps, chunks of 3: each chunk is one whole episode. Every frame is captioned
    with its own episode's step and return, and an episode's last frame is its own image (the
    toy's image is state id + t), not the next episode's first."""
    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 3)]), chunk_reset=chunk_reset)
    rec = RecordVideo(env, tmp_path / "rollout.mp4")
    frames = []
    rec._push = lambda images, lines: frames.append((lines[0].split(" r=")[0], lines[0].split("R=")[-1],
                                                     int(images[0, 0, 0, 0])))
    obs, _ = rec.reset(seed=0)
    first_id = int(obs["state"][0, 1])
    out = rec.chunk_step(np.zeros((1, 3, 7), np.float32))
    second_id = int(out.obs["state"][0, 1])
    rec.chunk_step(np.zeros((1, 3, 7), np.float32))
    rec.close()
    assert [f[0] for f in frames] == ["env 0 t=0", "t=1", "t=2", "t=3", "t=1", "t=2", "t=3"]
    assert [f[1] for f in frames[1:]] == ["0.10", "0.20", "0.30"] * 2
    images = [first_id + t for t in range(4)] + [second_id + t for t in (1, 2, 3)]
    assert [f[2] for f in frames] == [v % 256 for v in images]


@pytest.mark.parametrize("chunk_reset, skip, captions", [
    ("end_of_chunk", None, ["t=1", "t=2", "t=3", "t=3 ended R=0.30 (waits for reset)"] * 2),
    ("immediate", False, ["t=1", "t=2", "t=3", "t=1", "t=2", "t=3", "t=1", "t=2"]),
])
def test_the_overlay_follows_episodes_that_end_inside_a_chunk(tmp_path, chunk_reset, skip, captions):
    """Episodes of 3 steps, chunks of 4. The overlay kept its own step counter: a finished env waiting for
    its reset was captioned t=0 as if a new episode ran, and an episode begun inside a chunk (immediate
    resets, finished envs stepped: the GPU backend's setting) was counted one step late, with a wrong
    return. Captions now follow the env's own step count and what each sub-step stepped."""
    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 3)]), chunk_reset=chunk_reset,
                         skip_finished_actions=skip)
    rec = RecordVideo(env, tmp_path / "rollout.mp4")
    lines = []
    rec._push = lambda images, text: lines.append(text[0])
    rec.reset(seed=0)
    for _ in range(2):
        rec.chunk_step(np.zeros((1, 4, 7), np.float32))
    rec.close()
    assert [line.split(" r=")[0] for line in lines[1:]] == captions
    returns = [float(line.split("R=")[1].split()[0]) for line in lines[1:]]
    steps = [int(line.split()[0][2:]) for line in lines[1:]]
    assert returns == pytest.approx([0.1 * t for t in steps])  # each episode's own return


def test_a_video_the_encoder_could_not_finish_is_reported_after_the_rollout(tmp_path):
    """ffmpeg writes a short video only when it closes; a full disk then left an unreadable file and
    close() said nothing. The file is now checked (its MP4 boxes) and the failure reported."""
    from vla_envs.errors import VideoWriteError
    from vla_envs.wrappers.video import mp4_is_complete

    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)]))
    rec = RecordVideo(env, tmp_path / "rollout.mp4")
    rec.reset(seed=0)
    rec.chunk_step(np.zeros((1, 4, 7), np.float32))
    rec.close()
    assert mp4_is_complete(tmp_path / "rollout.mp4")
    data = (tmp_path / "rollout.mp4").read_bytes()
    for cut in (len(data) - 1, len(data) // 2, 7):  # what a full disk leaves: a file cut short
        (tmp_path / "cut.mp4").write_bytes(data[:cut])
        assert not mp4_is_complete(tmp_path / "cut.mp4")
    if Path("/dev/full").exists():  # a device every write to fails with ENOSPC
        env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)]))
        (tmp_path / "full.mp4").symlink_to("/dev/full")
        rec = RecordVideo(env, tmp_path / "full.mp4")
        rec.reset(seed=0)
        out = rec.chunk_step(np.zeros((1, 4, 7), np.float32))  # the rollout itself goes on
        assert out.valid.all()
        with pytest.raises(VideoWriteError, match="full.mp4 failed"):
            rec.close()
        assert env.closed


@pytest.mark.parametrize("name, says", [("a.txt", "must end in .mp4"), ("folder.mp4", "is a folder"),
                                        ("file/x.mp4", "is a file, not a folder"),
                                        ("file/deeper/x.mp4", "is a file, not a folder"),
                                        ("/proc/rollout.mp4", "cannot be written")])
def test_a_video_path_that_cannot_be_written_is_refused_before_the_rollout(tmp_path, capsys, name, says):
    from vla_trainer.cli.eval import main as eval_main

    (tmp_path / "folder.mp4").mkdir()
    (tmp_path / "file").write_text("not a folder")
    video = str(tmp_path / name)
    with pytest.raises(SystemExit) as e:
        main(["rollout", "vla/PickCube-v1", "--video", video])
    assert e.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        eval_main(["--checkpoint", str(tmp_path), "--video", video])
    assert e.value.code == 2 and says in capsys.readouterr().err
    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)]))
    with pytest.raises(ValueError, match=says):
        RecordVideo(env, video)
    env.close()


def test_unknown_id_lists_close_matches():
    with pytest.raises(VlaEnvError, match="did you mean: vla/PickCube-v1"):
        get_task("vla/PickCub-v1")
    import gymnasium as gym

    with pytest.raises(gym.error.NameNotFound, match="Did you mean: `PickCube`"):
        gym.make("vla/PickCub-v1")


def test_missing_backend_names_the_install_command():
    TASKS["vla/NeedsMissing-v0"] = TaskSpec(
        "vla/NeedsMissing-v0", "libero", "tests", 10, "toy_env:make_toy_vector_env",
        requires=("a_module_that_is_not_installed",), extra="libero")
    register_all()
    import gymnasium as gym

    with pytest.raises(BackendNotInstalledError, match=r"pip install 'vla-rl\[libero\]'"):
        gym.make("vla/NeedsMissing-v0", num_envs=1)
    del TASKS["vla/NeedsMissing-v0"]


def test_cli_list_prints_every_id(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for env_id in vla_envs.TASKS:
        assert env_id in out
    assert "max_steps" in out


def test_cli_rollout_unknown_id_exits_nonzero(capsys):
    assert main(["rollout", "vla/PickCub-v1"]) == 2
    assert "did you mean" in capsys.readouterr().err


def test_rollout_episodes_do_not_favour_quick_successes(monkeypatch, tmp_path):
    """Episodes end at success or after 3 steps; the random gripper succeeds with probability 1/4 per
    step, so success_once is 1 - 0.75**3 = 0.578 whatever the episode's length. Counting the first 6
    episodes to end over 4 envs would favour the short, successful ones (0.64 over these 300 seeded
    runs); each env's first episodes are an unbiased count (3 standard errors allowed)."""
    import argparse

    from vla_envs.cli import run_episodes

    monkeypatch.setitem(TASKS, "vla/ToyShort-v0", TaskSpec("vla/ToyShort-v0", "toy", "tests", 3, "toy_env:make_toy_cli_env",
                                                         kwargs={"max_episode_steps": 3}))
    register_all()
    rates = []
    for seed in range(300):
        args = argparse.Namespace(env_id="vla/ToyShort-v0", command="rollout", policy="random", num_envs=4, episodes=6,
                                  steps=10**9, chunk=1, image_size=4, seed=seed, video=None, env_kwargs={})
        summary = run_episodes(args)
        assert summary["episodes"] == 6
        rates.append(summary["success_once"])
    truth, standard_error = 1 - 0.75**3, np.sqrt((1 - 0.75**3) * 0.75**3 / 1800)
    assert abs(np.mean(rates) - truth) < 3 * standard_error, np.mean(rates)
    # collect-demos records exactly the episodes it counts: 3 from env 0, then 1 from each other env
    args = argparse.Namespace(env_id="vla/ToyShort-v0", command="collect-demos", policy="random", num_envs=4,
                              episodes=6, steps=10**9, chunk=1, image_size=4, seed=0, video=None, env_kwargs={},
                              only_success=False)
    summary = run_episodes(args, recorder_folder=tmp_path / "demos")
    index = json.loads((tmp_path / "demos" / "index.json").read_text())
    assert summary["episodes"] == summary["demos_kept"] == len(index["episodes"]) == 6
    assert sum(e["success_once"] for e in index["episodes"]) == round(summary["success_once"] * 6)


@pytest.fixture
def toy_task(monkeypatch):
    """A registered toy id whose episodes last 50 steps under the zero policy (no success)."""
    monkeypatch.setitem(TASKS, "vla/ToyLong-v0", TaskSpec("vla/ToyLong-v0", "toy", "tests", 50, "toy_env:make_toy_cli_env",
                                                        kwargs={"max_episode_steps": 50}))
    register_all()
    return "vla/ToyLong-v0"


def test_episodes_asked_for_are_run_to_the_end_unless_steps_bound_them(toy_task, capsys):
    """The README's `collect-demos --episodes 50` stopped after the default 80 steps per env (about one
    PutOnPlate episode each) and said nothing; --episodes now runs until they finished, and a --steps
    bound that cuts them short is named."""
    base = ["rollout", toy_task, "--policy", "zero", "--num-envs", "2", "--image-size", "4"]
    assert main(base + ["--episodes", "6"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 6
    assert main(base + ["--episodes", "6", "--steps", "60"]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["episodes"] == 2 and "2 of the 6 episodes asked for finished within --steps 60" in out.err


def test_bad_rollout_options_are_named_before_the_envs_start(toy_task, capsys, tmp_path, monkeypatch):
    import vla_envs.cli as cli

    with pytest.raises(SystemExit) as e:
        main(["rollout", toy_task, "--seed", "-1"])
    assert e.value.code == 2 and "argument --seed: expected an integer >= 0" in capsys.readouterr().err
    assert main(["rollout", toy_task, "--env-kwargs", '{"num_envs": 3}']) == 2
    assert "num_envs is set by --num-envs" in capsys.readouterr().err
    # eval-ood checks --out before the variants run (minutes each), not after
    (tmp_path / "afile").write_text("")
    calls = []
    monkeypatch.setattr(cli, "run_episodes", lambda a: calls.append(a.env_id))
    assert main(["eval-ood", "--out", str(tmp_path / "afile" / "ood")]) == 2
    assert calls == [] and "afile" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
@pytest.mark.reliability(fault="the disk fills up while a rollout's video is written", cases=1,
                         outcome="the rollout runs to its end; its summary is printed and the video named failed (exit 1)")
def test_a_video_that_failed_is_reported_with_the_rollouts_numbers(toy_task, capsys, tmp_path):
    """A video the disk could not take raised out of close() as a traceback, losing the rollout's
    summary; now the summary is printed and the failure named, exit 1."""
    (tmp_path / "full.mp4").symlink_to("/dev/full")  # every write fails with ENOSPC
    assert main(["rollout", toy_task, "--policy", "zero", "--num-envs", "1", "--image-size", "4", "--steps", "8",
                 "--video", str(tmp_path / "full.mp4")]) == 1
    out = capsys.readouterr()
    summary = json.loads(out.out)
    assert summary["env_steps"] == 8 and summary["video"] is None and "full.mp4 failed" in summary["video_error"]
    assert "vla-envs: error: writing" in out.err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_vla_eval_keeps_its_results_when_the_video_fails(tmp_path, capsys):
    """vla-eval closed its recorder in a finally: a video error there lost the evaluation just run."""
    from vla_trainer.cli.eval import close_recording

    env = ChunkVectorEnv(SerialBackend([functools.partial(ToyEnv, 4)]))
    (tmp_path / "full.mp4").symlink_to("/dev/full")
    rec = RecordVideo(env, tmp_path / "full.mp4")
    rec.reset(seed=0)
    rec.chunk_step(np.zeros((1, 4, 7), np.float32))
    errors: list[str] = []
    close_recording(rec, errors)
    assert env.closed and len(errors) == 1 and "full.mp4 failed" in errors[0]
    assert "results are reported without it" in capsys.readouterr().err


def test_a_rollout_over_enumerated_initial_states_ends_when_they_have_run(toy_task, capsys):
    """With fewer enumerated initial states than --episodes, the envs went idle and the rollout
    (unbounded steps: eval-ood's setting) never ended."""
    assert main(["rollout", toy_task, "--policy", "zero", "--num-envs", "2", "--image-size", "4", "--episodes", "6",
                 "--env-kwargs", '{"enumerate_initial_states": [0, 1, 2]}']) == 0
    out = capsys.readouterr()
    assert json.loads(out.out)["episodes"] == 3 and "3 of the 6 episodes asked for finished before every" in out.err


def test_a_rollout_video_plays_at_the_tasks_control_rate(toy_task, tmp_path, capsys):
    """--fps defaulted to 10: a 5 Hz PutOnPlate rollout played twice as fast as it ran."""
    assert get_task("PutOnPlateInScene25Main-v3").control_hz == 5.0 and get_task("libero_goal").control_hz == 20.0
    assert main(["rollout", toy_task, "--policy", "zero", "--num-envs", "1", "--image-size", "4", "--steps", "4",
                 "--video", str(tmp_path / "v.mp4")]) == 0
    assert imageio.get_reader(tmp_path / "v.mp4", format="FFMPEG").get_meta_data()["fps"] == TASKS[toy_task].control_hz
