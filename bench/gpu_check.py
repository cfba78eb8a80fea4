"""One check of the project on a CUDA machine: what runs there and how fast, as a table and JSON.

    .venv/bin/python bench/gpu_check.py [--out gpu_check.json] [--parts env expert rl generation lora]
                                        [--timeout-s 600]

Each part runs in its own subprocess with its own timeout, so a part that fails or hangs is
reported and the others still run:

  env         PutOnPlateInScene25Main-v3 env frames/s through the contract on GPU physics at 64,
              256 and 1024 envs, low-poly and stock Panda, 128 px, random 8-step chunks; and
              whether a partial reset of one env leaves the others' state and image unchanged
  expert      the scripted expert's success_once on the GPU batch (256 episodes at once, run to
              the time limit), beside its CPU figure (CPU_EXPERT_SUCCESS)
  rl          3 PPO and 3 GRPO iterations of the tiny preset (the CPU recipes, 64 envs, GPU physics,
              the model on the GPU); frames/s = env frames / iteration wall time, as the paper counts,
              over the iterations after the first (start-up and the first's warm-up left out)
  generation  full-size OpenVLA vs OpenVLA-OFT action generation in bf16 at batch 8, 32, 64
              (random weights built on the device)
  lora        one full-size OpenVLA-OFT LoRA PPO update (rank 32): time and peak GPU memory at
              micro-batch 4, 8, 16

Nothing is downloaded: stage SAPIEN's PhysX GPU library first (``vla-envs fetch-physx``) and the
procedural assets are made locally. The full-size parts use a byte-level tokenizer padded to the
Llama vocabulary's size (the prompt's text does not change the compute; the real tokenizer ships
with a checkpoint). ``--smoke`` runs every part at toy size on the CPU (CPU physics, the batched
in-process backend, tiny presets, float32): the same code paths without a GPU, what the tests run.
Results go to docs/benchmarks.md with the command that produced them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

PARTS = ("env", "expert", "rl", "generation", "lora")
TASK = "PutOnPlateInScene25Main-v3"
CPU_EXPERT_SUCCESS = 0.973
"""The scripted expert's success_once on CPU physics: 876 of 900 episodes of the shipped warm start's
demo collection (docs/results.md)."""
INSTRUCTIONS = ("put the carrot on the plate", "put the spoon on the towel", "put eggplant in basket")


def cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def device_of(smoke: bool) -> str:
    return "cpu" if smoke else "cuda"


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


# ----------------------------------------------------------------------------------- the envs
def put_on_plate(num_envs: int, smoke: bool, **kwargs):
    """The main task on GPU physics (``--smoke``: CPU physics, the same batched in-process backend)."""
    import gymnasium as gym

    import vla_envs  # noqa: F401  (registers the ids)

    return gym.make(TASK, num_envs=num_envs, sim_backend="physx_cpu" if smoke else "physx_cuda",
                    vectorization="batched", assets="procedural", **kwargs)


def part_env(smoke: bool) -> dict:
    sizes, panda, image, chunks = ([1], (True,), 32, 1) if smoke else ([64, 256, 1024], (True, False), 128, 5)
    rng = np.random.default_rng(0)
    rows, others_unchanged = [], None
    for n in sizes:
        for low_poly in panda:
            env = put_on_plate(n, smoke, image_size=image, low_poly=low_poly)
            try:
                env.reset(seed=0)
                actions = rng.uniform(-1, 1, (n, 8, 7)).astype(np.float32)
                env.chunk_step(actions)  # warm-up: the first step compiles and allocates
                if n > 1 and others_unchanged is None:
                    others_unchanged = partial_reset_keeps_the_others(env)
                start = time.perf_counter()
                for _ in range(chunks):
                    env.chunk_step(actions)
                seconds = time.perf_counter() - start
            finally:
                env.close()
            rows.append({"num_envs": n, "low_poly": low_poly, "image_px": image,
                         "frames_per_s": n * 8 * chunks / seconds})
            print(f"env: {n} envs, low_poly={low_poly}: {rows[-1]['frames_per_s']:.0f} frames/s", flush=True)
    return {"rows": rows, "partial_reset_others_unchanged": others_unchanged}


def partial_reset_keeps_the_others(env) -> bool:
    """Reset env 0 alone (PutOnPlate lets the new scene settle by stepping the physics, which on a
    GPU batch steps every env) and check that the other envs' state and image did not change, read
    from the simulator itself (the vector env keeps the others' last observation)."""
    from vla_envs.backends.maniskill.common import convert_obs

    task = env.backend._env.unwrapped
    before = convert_obs(task.get_obs())
    mask = np.zeros(env.num_envs, bool)
    mask[0] = True
    env.reset(options={"reset_mask": mask})
    after = convert_obs(task.get_obs())
    same = bool(np.allclose(after["state"][1:], before["state"][1:], atol=1e-5)
                and np.array_equal(after["image"][1:], before["image"][1:]))
    print(f"env: a partial reset of env 0 left the other {env.num_envs - 1} envs "
          f"{'unchanged' if same else 'CHANGED'}", flush=True)
    return same


def part_expert(smoke: bool) -> dict:
    from vla_envs.core.backend import env_rows
    from vla_envs.tasks.put_on_plate.expert import ScriptedExpert

    n, steps = (1, 10) if smoke else (256, 80)
    env = put_on_plate(n, smoke, image_size=32, low_poly=True, time_limit=steps, auto_reset=False,
                       ignore_terminations=True)
    try:
        env.reset(seed=0)
        expert, success = ScriptedExpert(n), np.zeros(n, bool)
        start = time.perf_counter()
        for _ in range(steps):
            _, _, _, truncated, info = env.step(expert.act(env_rows(env.expert_state())))
            success |= info["success"]
            if truncated.all():
                break
        seconds = time.perf_counter() - start
    finally:
        env.close()
    print(f"expert: success_once {success.mean():.3f} of {n} episodes (CPU: {CPU_EXPERT_SUCCESS})", flush=True)
    return {"episodes": n, "success_once": float(success.mean()), "cpu_success_once": CPU_EXPERT_SUCCESS,
            "episode_seconds": seconds}


# ----------------------------------------------------------------------------------- training
def part_rl(smoke: bool) -> dict:
    from vla_trainer.config import load_config
    from vla_trainer.metrics_log import read_metrics
    from vla_trainer.runner import train

    if smoke:  # the CPU worker path at toy size (GRPO needs groups of 2, which one batched CPU env cannot hold)
        size = ["env.train.total_num_envs=2", "env.train.vectorization=serial", "rollout.steps_per_rollout=8",
                "actor.global_batch_size=2", "actor.micro_batch_size=1", "algorithm.group_size=2"]
        iterations = 1
    else:
        size = ["env.train.total_num_envs=64", "env.train.env_kwargs.sim_backend=physx_cuda"]
        iterations = 3  # the first warms up and is left out
    rows = []
    for algorithm in ("ppo", "grpo"):
        cfg = load_config(f"cpu_{algorithm}_tiny_put_on_plate", [
            *size, f"runner.max_epochs={iterations}", "runner.val_check_interval=-1", "runner.save_interval=-1",
            "runner.progress_bar=false", "cluster.runtime=local"])
        with tempfile.TemporaryDirectory() as run_dir:
            start = time.perf_counter()
            result = train(cfg, run_dir=run_dir)
            seconds = time.perf_counter() - start
            records = [r for r in read_metrics(run_dir) if "time/iteration" in r]
        # env frames / iteration wall time, as the paper counts: start-up (envs, model, CUDA context)
        # and the final checkpoint are outside the iterations; the first iteration warms up
        frames = np.diff([0] + [r["env_steps"] for r in records])
        timed = slice(1, None) if len(records) > 1 else slice(None)
        iteration_s = [r["time/iteration"] for r in records]
        rows.append({"algorithm": algorithm, "iterations": result.iterations, "env_frames": result.env_steps,
                     "iteration_seconds": iteration_s, "seconds_with_startup": seconds,
                     "warmup_iterations_left_out": 1 if len(records) > 1 else 0,
                     "frames_per_s": float(frames[timed].sum() / sum(iteration_s[timed]))})
        print(f"rl: {algorithm} {result.iterations} iterations, {rows[-1]['frames_per_s']:.0f} frames/s "
              f"(iteration wall time; {seconds:.0f} s with start-up)", flush=True)
    return {"rows": rows}


def build_policy_on(preset: str, device: str, dtype=None, lora_rank: int = 0):
    """A randomly initialised policy of ``preset`` built directly on ``device`` (``"meta"``: shapes
    only, what the tests check at full size) in ``dtype`` (default float32)."""
    import torch

    from vla_trainer.models import VLAPolicy, apply_lora, build_config, identity_norm_stats
    from vla_trainer.models.presets import build_tokenizer, model_class_for
    from vla_trainer.models.tokenizer import build_byte_tokenizer

    # identity action statistics: a full-size config has none until a checkpoint brings its own
    config = build_config(preset, value_type="chunk_level", norm_stats=identity_norm_stats())
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype or torch.float32)
    try:
        with torch.device(device):
            model = model_class_for(config)(config).eval()
    finally:
        torch.set_default_dtype(previous)
    if preset.startswith("tiny"):
        tokenizer = build_tokenizer(config)
    else:  # the Llama vocabulary's size and layout, without its download
        tokenizer = build_byte_tokenizer(config.n_action_bins, vocab_size=config.tokenizer_vocab_size)
    if lora_rank:
        model = apply_lora(model, rank=lora_rank)
    return VLAPolicy(model, tokenizer)


def make_obs(n: int, size: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    return {"image": rng.integers(0, 256, (n, size, size, 3), dtype=np.uint8),
            "instruction": tuple(INSTRUCTIONS[i % len(INSTRUCTIONS)] for i in range(n))}


def part_generation(smoke: bool) -> dict:
    import torch

    presets = ("tiny-openvla", "tiny-openvla-oft") if smoke else ("openvla-7b", "openvla-oft-7b")
    batches, rounds = ([2], 1) if smoke else ([8, 32, 64], 5)
    device, rows = device_of(smoke), []
    for preset in presets:
        policy = build_policy_on(preset, device, None if smoke else torch.bfloat16)
        generator = torch.Generator(device=device).manual_seed(0)
        for n in batches:
            inputs = policy.prepare(make_obs(n, policy.config.image_size))
            with torch.no_grad():
                policy.act(inputs, generator=generator)  # warm-up
                policy.act(inputs, generator=torch.Generator().manual_seed(0))  # a CPU generator, as evaluations seed
                times = []
                for _ in range(rounds):
                    synchronize(device)
                    start = time.perf_counter()
                    policy.act(inputs, generator=generator)
                    synchronize(device)
                    times.append(time.perf_counter() - start)
            calls = 1.0 / float(np.median(times))
            rows.append({"preset": preset, "batch": n, "calls_per_s": calls,
                         "env_actions_per_s": calls * n * policy.chunk_size})
            print(f"generation: {preset} batch {n}: {rows[-1]['env_actions_per_s']:.0f} env actions/s", flush=True)
        del policy
        if device == "cuda":
            torch.cuda.empty_cache()
    return {"rows": rows}


def part_lora(smoke: bool) -> dict:
    import torch

    preset, micro_batches = ("tiny-openvla-oft", [1]) if smoke else ("openvla-oft-7b", [4, 8, 16])
    device = device_of(smoke)
    policy = build_policy_on(preset, device, None if smoke else torch.bfloat16, lora_rank=32)
    optimizer = torch.optim.AdamW(policy.param_groups(lr=1e-4, value_lr=3e-3))
    params = [p for g in optimizer.param_groups for p in g["params"]]
    rows = []
    for n in micro_batches:
        with torch.no_grad():
            sample = policy.act(policy.prepare(make_obs(n, policy.config.image_size)),
                                generator=torch.Generator(device=device).manual_seed(0))
        advantages = torch.randn(n, 1, 1, device=device)
        returns = torch.randn(n, 1, device=device)
        policy.model.train()
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(2):  # the first step allocates the optimizer state
            synchronize(device)
            start = time.perf_counter()
            ev = policy.evaluate(sample.inputs, sample.action_token_ids)
            ratio = (ev.log_probs.float() - sample.log_probs.float()).exp()
            surrogate = torch.minimum(ratio * advantages, ratio.clamp(0.8, 1.2) * advantages)
            loss = -surrogate.mean() + 0.5 * (ev.values.float() - returns).pow(2).mean()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 10.0)
            optimizer.step()
            synchronize(device)
            times.append(time.perf_counter() - start)
        policy.model.eval()
        peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
        rows.append({"micro_batch": n, "update_s": times[-1], "peak_gpu_gib": peak,
                     "trainable_params": sum(p.numel() for p in params)})
        print(f"lora: micro-batch {n}: {times[-1]:.2f} s, peak {peak} GiB", flush=True)
    return {"rows": rows}


RUNNERS = {"env": part_env, "expert": part_expert, "rl": part_rl, "generation": part_generation, "lora": part_lora}


# ----------------------------------------------------------------------------------- driver
def run_part(part: str, smoke: bool, timeout_s: float) -> dict:
    """``part`` in a fresh process: ``{"part", "status": ok | failed | timeout, "seconds", ...}``."""
    with tempfile.TemporaryDirectory() as tmp:
        result_file = Path(tmp) / "result.json"
        cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part, "--result", str(result_file)]
        start = time.perf_counter()
        try:
            proc = subprocess.run(cmd + (["--smoke"] if smoke else []), capture_output=True, text=True,
                                  timeout=timeout_s, env={**os.environ, "HF_HUB_OFFLINE": "1"})
        except subprocess.TimeoutExpired:
            return {"part": part, "status": "timeout", "seconds": timeout_s}
        seconds = time.perf_counter() - start
        if proc.returncode != 0 or not result_file.is_file():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
            return {"part": part, "status": "failed", "seconds": seconds, "exit_code": proc.returncode,
                    "error": "\n".join(tail)}
        return {"part": part, "status": "ok", "seconds": seconds, **json.loads(result_file.read_text())}


def summary(result: dict) -> str:
    if result["status"] != "ok":
        lines = result.get("error", "").splitlines()
        return lines[-1] if lines else result["status"]
    if "rows" in result:
        key = next(k for k in ("frames_per_s", "env_actions_per_s", "update_s") if k in result["rows"][0])
        kept = {True: "; partial reset: others unchanged", False: "; partial reset CHANGED other envs",
                None: ""}[result.get("partial_reset_others_unchanged")]
        return ", ".join(f"{row[key]:.3g}" for row in result["rows"]) + f" ({key})" + kept
    return f"success_once {result['success_once']:.3f} (CPU {result['cpu_success_once']})"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    p.add_argument("--timeout-s", type=float, default=600.0, help="per part (default: %(default)s)")
    p.add_argument("--out", type=Path, default=Path("gpu_check.json"), help="the JSON written (default: %(default)s)")
    p.add_argument("--smoke", action="store_true", help="every part at toy size on the CPU (no GPU needed)")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # one part, in the child process
    p.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.part is not None:
        args.result.write_text(json.dumps(RUNNERS[args.part](args.smoke)))
        return 0
    if not args.smoke and not cuda_available():
        print("error: bench/gpu_check.py measures a CUDA GPU and this machine has none (torch.cuda.is_available() "
              "is False); run it on a GPU node, or add --smoke to run every part at toy size on the CPU",
              file=sys.stderr)
        return 2
    results = []
    for part in args.parts:
        print(f"== {part}", flush=True)
        results.append(run_part(part, args.smoke, args.timeout_s))
    print(f"\n{'part':<11} {'status':<8} {'seconds':>8}  result")
    for r in results:
        print(f"{r['part']:<11} {r['status']:<8} {r['seconds']:>8.1f}  {summary(r)}")
    args.out.write_text(json.dumps({"smoke": args.smoke, "parts": results}, indent=1))
    print(f"written: {args.out}")
    return 0 if all(r["status"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
