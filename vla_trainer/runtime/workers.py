"""The three components as plain classes; ``RayRuntime`` runs each as a Ray actor on its device.

    EnvWorker      k sub-simulators (pipeline stages) of ``envs_per_stage`` envs each
    RolloutWorker  the rollout policy: samples action chunks, values, V(final obs); evaluation
    ActorWorker    the trained policy and optimizer (an rl.actor.Actor); one data-parallel rank of the update

What moves between them (numpy arrays and tensors; Ray passes them through its shared-memory
object store, and the actions go from rollout worker to env worker without the driver):

    EnvWorker.reset / step -> ObsOut  {"obs": {"image" [n,H,W,3] uint8, "instruction" (n str), ...},
                                       "final": None | {"image", "instruction", "state"?, "cut" [m] int}}
    RolloutWorker.act(ObsOut) -> ActOut {"actions" [n,C,7] float32, "token_ids"/"log_probs" [n,C,A],
                                         "values" [n,V] | None, "final_values" [n], "seconds"}
    EnvWorker.step -> StepRecord {"rewards"/"terminated"/"truncated"/"valid" [n,C], "episodes", "seconds"}

``final_values`` of an ``act`` are V(final observation) of the envs whose episode the *previous*
step truncated (bootstrapping), so no extra round trip is needed for them.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import numpy as np
import torch

from vla_trainer.build import build_policy, iteration_seed, make_env
from vla_trainer.config.schema import TrainConfig
from vla_trainer.models import EnvGenerators
from vla_trainer.rl.actor import Actor
from vla_trainer.rl.rollout import autoreset_mode, finished_episodes, truncated_finals, values_of

from .placement import WorkerSpec

THREAD_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "LP_NUM_THREADS")
"""Set to 1 in a CPU worker's environment: math and lavapipe render threads stay on its one core."""


def pin(spec: WorkerSpec) -> None:
    """Run this process on its device: one CPU core (and one thread) or its GPU."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # one weight-loading bar per worker would bury the training bar
    if spec.kind == "cpu":
        os.sched_setaffinity(0, {spec.device})
        torch.set_num_threads(1)
    elif torch.cuda.is_available():
        torch.cuda.set_device(0)  # Ray exposes exactly the worker's GPU as device 0


def device_of(spec: WorkerSpec) -> str:
    return "cuda" if spec.kind == "cuda" else "cpu"


def stage_rows(env_rank: int, stage: int, per_worker: int, per_stage: int) -> np.ndarray:
    """Global env indices of pipeline stage ``stage`` of env worker ``env_rank``."""
    first = env_rank * per_worker + stage * per_stage
    return np.arange(first, first + per_stage)


def move_optimizer_state(optimizer: torch.optim.Optimizer, device: str) -> None:
    for st in optimizer.state.values():
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                st[k] = v.to(device)


class EnvWorker:
    def __init__(self, cfg: TrainConfig, spec: WorkerSpec, per_worker: int, per_stage: int, image_size: int):
        pin(spec)
        self.cfg, self.spec = cfg, spec
        self.per_worker, self.per_stage, self.image_size = per_worker, per_stage, image_size
        self.stages = self._build()

    def _build(self) -> list:
        cfg, spec, n = self.cfg, self.spec, self.per_stage
        vec = "serial" if spec.kind == "cpu" else None  # one core per worker: no process pool inside it
        return [make_env(cfg.env.train, self.image_size, group_size=cfg.algorithm.group_size, num_envs=n,
                         first_env_index=spec.rank * self.per_worker + s * n, vectorization=vec)
                for s in range(self.per_worker // n)]

    def info(self) -> dict:
        e = self.stages[0] if self.stages else None
        return {"asset_pack": getattr(e, "asset_pack", None), "pid": os.getpid()}

    def offload(self) -> None:
        """Releases the simulators: the next rollout starts from fresh resets, so no state must survive."""
        self.close()
        self.stages = None

    def reset(self, seed_key: int) -> list[dict] | dict:
        """Fresh episodes in every stage; one ObsOut per stage (simulators rebuilt if offloaded)."""
        if self.stages is None:
            self.stages = self._build()
        out = []
        self.stepped = [0] * len(self.stages)  # sub-steps of the rollout so far, per stage
        for env in self.stages:
            obs, _ = env.reset(seed=iteration_seed(self.cfg.actor.seed, seed_key))
            out.append({"obs": obs, "final": None})
        return out if len(out) > 1 else out[0]

    def step(self, stage: int, act: dict) -> tuple[dict, dict]:
        """Executes one action chunk in stage ``stage``: (ObsOut, StepRecord)."""
        t0 = time.perf_counter()
        env = self.stages[stage]
        out = env.chunk_step(act["actions"])
        cut, finals = truncated_finals(out, autoreset_mode(env))
        final = None if finals is None else {**finals, "cut": cut}
        episodes = finished_episodes(out, self.stepped[stage], self.cfg.rollout.steps_per_rollout,
                                     env.max_episode_steps)
        episodes = {k: np.asarray(v, dtype=float) for k, v in episodes.items()}
        self.stepped[stage] += out.rewards.shape[1]
        record = {"rewards": out.rewards, "terminated": out.terminated, "truncated": out.truncated,
                  "valid": out.valid, "episodes": episodes, "seconds": time.perf_counter() - t0}
        return {"obs": out.obs, "final": final}, record

    def close(self) -> None:
        for env in self.stages or []:
            env.close()


class RolloutWorker:
    def __init__(self, cfg: TrainConfig, spec: WorkerSpec, env_ranks: list[int], per_worker: int, per_stage: int):
        pin(spec)
        self.cfg, self.spec = cfg, spec
        self.policy = build_policy(cfg, device=device_of(spec))
        self.critic = cfg.algorithm.loss_type == "actor_critic"
        self.per_worker, self.per_stage = per_worker, per_stage
        self.rows = np.concatenate([np.arange(e * per_worker, (e + 1) * per_worker) for e in env_ranks])
        self.generators: dict[int, torch.Generator] = {}
        self.eval_env = None

    def info(self) -> dict:
        return {"pid": os.getpid()}

    def set_weights(self, state_dict: dict) -> float:
        t0 = time.perf_counter()
        self.policy.model.load_state_dict(state_dict)
        return time.perf_counter() - t0

    def begin(self, key: int) -> None:
        """Seeds every env's sampling generator for the rollout with key ``key``."""
        gens = EnvGenerators.seeded(self.cfg.actor.seed, (key,), self.rows.tolist())
        self.generators = dict(zip(self.rows.tolist(), gens.generators))

    @torch.no_grad()
    def act(self, env_rank: int, stage: int, obs_out: dict, values_only: bool = False) -> dict:
        t0 = time.perf_counter()
        sp = self.cfg.algorithm.sampling_params
        top_k = sp.top_k or None
        rows = stage_rows(env_rank, stage, self.per_worker, self.per_stage)
        final_values = torch.zeros(len(rows))
        final = obs_out["final"]
        if final is not None and self.critic:
            v = values_of(self.policy, {k: x for k, x in final.items() if k != "cut"}, sp.temperature_train, top_k)
            final_values[torch.as_tensor(final["cut"])] = v.float().cpu()
        if values_only:
            v = values_of(self.policy, obs_out["obs"], sp.temperature_train, top_k) if self.critic else None
            return {"next_values": None if v is None else v.float().cpu(), "final_values": final_values,
                    "seconds": time.perf_counter() - t0}
        gens = EnvGenerators([self.generators[int(r)] for r in rows])
        sample = self.policy.act(obs_out["obs"], temperature=sp.temperature_train, top_k=top_k, generator=gens)
        return {"actions": sample.actions.float().cpu().numpy(), "token_ids": sample.action_token_ids.cpu(),
                "log_probs": sample.log_probs.float().cpu(),
                "values": None if sample.values is None else sample.values.float().cpu(),
                "final_values": final_values, "seconds": time.perf_counter() - t0}

    def evaluate(self) -> dict:
        from vla_trainer.rl.evaluation import evaluate_recipe

        cfg = self.cfg
        if self.eval_env is None:
            vec = "serial" if self.spec.kind == "cpu" else None
            self.eval_env = make_env(cfg.env.eval, self.policy.config.image_size, evaluation=True, vectorization=vec)
        return evaluate_recipe(self.eval_env, self.policy, cfg)

    def offload(self) -> None:
        self.policy.model.to("cpu")

    def onload(self) -> None:
        self.policy.model.to(device_of(self.spec))

    def close(self) -> None:
        if self.eval_env is not None:
            self.eval_env.close()


class ActorWorker:
    def __init__(self, cfg: TrainConfig, spec: WorkerSpec, world_size: int, resume_from: str | None,
                 state: dict | None):
        pin(spec)
        self.cfg, self.spec, self.world_size = cfg, spec, world_size
        self.actor = Actor(cfg, resume_from, state, device=device_of(spec))
        self.policy = self.actor.policy
        self.group = None

    def info(self) -> dict:
        p = self.policy
        return {"chunk_size": p.chunk_size, "image_size": p.config.image_size, "pid": os.getpid()}

    @staticmethod
    def free_address() -> str:
        """A ``tcp://ip:port`` on this node for the data-parallel group's rendezvous."""
        import ray

        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"tcp://{ray.util.get_node_ip_address()}:{port}"

    def init_group(self, address: str) -> None:
        import torch.distributed as dist

        backend = "nccl" if self.spec.kind == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=address, rank=self.spec.rank, world_size=self.world_size)
        self.group = dist.group.WORLD

    def update(self, rollout, targets, iteration: int) -> dict:
        all_reduce = None
        if self.world_size > 1:
            import torch.distributed as dist

            all_reduce = dist.all_reduce
        return self.actor.update(rollout, targets, iteration, rank=self.spec.rank, world_size=self.world_size,
                                 all_reduce=all_reduce)

    def get_weights(self) -> dict:
        return {k: v.detach().cpu() for k, v in self.policy.model.state_dict().items()}

    def save(self, run_dir: str, state: dict) -> Path:
        return self.actor.save(Path(run_dir), state)

    def offload(self) -> None:
        self.policy.model.to("cpu")
        move_optimizer_state(self.actor.optimizer, "cpu")

    def onload(self) -> None:
        self.policy.model.to(device_of(self.spec))
        move_optimizer_state(self.actor.optimizer, device_of(self.spec))

    def close(self) -> None:
        if self.group is not None:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.group = None
