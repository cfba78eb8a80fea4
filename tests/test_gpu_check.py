"""bench/gpu_check.py, the one command for a CUDA machine: it refuses without CUDA, and every part
runs its code path at toy size on the CPU (--smoke), each isolated in its own process."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


@pytest.fixture(scope="module")
def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_refuses_without_cuda_naming_the_smoke_run(gpu_check, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "cuda_available", lambda: False)
    assert gpu_check.main(["--out", str(tmp_path / "gpu.json")]) == 2
    err = capsys.readouterr().err
    assert "has none (torch.cuda.is_available() is False)" in err and "--smoke" in err
    assert not (tmp_path / "gpu.json").exists()


def test_a_part_past_its_timeout_is_reported_not_waited_for(gpu_check):
    result = gpu_check.run_part("env", smoke=True, timeout_s=0.5)
    assert result == {"part": "env", "status": "timeout", "seconds": 0.5}


@pytest.mark.slow
@pytest.mark.maniskill
def test_every_part_runs_at_toy_size_on_the_cpu(gpu_check, tmp_path, capsys):
    out = tmp_path / "gpu.json"
    assert gpu_check.main(["--smoke", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    parts = {p["part"]: p for p in report["parts"]}
    assert report["smoke"] and list(parts) == list(gpu_check.PARTS)
    assert all(p["status"] == "ok" for p in parts.values()), parts
    [env_row] = parts["env"]["rows"]
    assert env_row["num_envs"] == 1 and env_row["frames_per_s"] > 0
    assert parts["expert"]["episodes"] == 1 and 0.0 <= parts["expert"]["success_once"] <= 1.0
    assert [(r["algorithm"], r["iterations"]) for r in parts["rl"]["rows"]] == [("ppo", 1), ("grpo", 1)]
    for r in parts["rl"]["rows"]:  # per iteration wall time, not the whole call with its start-up
        assert r["env_frames"] > 0 and r["frames_per_s"] == pytest.approx(r["env_frames"] / r["iteration_seconds"][0])
        assert r["seconds_with_startup"] > r["iteration_seconds"][0]
    assert [r["preset"] for r in parts["generation"]["rows"]] == ["tiny-openvla", "tiny-openvla-oft"]
    assert all(r["env_actions_per_s"] > 0 for r in parts["generation"]["rows"])
    [lora] = parts["lora"]["rows"]
    assert lora["micro_batch"] == 1 and lora["update_s"] > 0 and lora["trainable_params"] > 0
    table = capsys.readouterr().out
    assert "part        status" in table and f"written: {out}" in table


@pytest.mark.parametrize("preset", ["openvla-7b", "openvla-oft-7b"])
def test_the_full_size_parts_build_their_policy_on_the_device_it_names(gpu_check, preset):
    """On the meta device (shapes, no memory): the 7B policy the generation and LoRA parts build,
    with the stand-in tokenizer of the Llama vocabulary's layout, prepares its inputs there."""
    import torch

    policy = gpu_check.build_policy_on(preset, "meta", torch.bfloat16)
    params = list(policy.model.parameters())
    assert all(p.is_meta and p.dtype == torch.bfloat16 for p in params)
    assert sum(p.numel() for p in params) > 7e9
    assert policy.tokenizer.pad_token_id == policy.config.pad_token_id == 32000
    inputs = policy.prepare(gpu_check.make_obs(2, policy.config.image_size))
    assert inputs.pixel_values.is_meta and inputs.pixel_values.shape == (2, 6, 224, 224)
    assert inputs.input_ids.is_meta and inputs.input_ids.shape[0] == 2
