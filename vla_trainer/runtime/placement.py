"""Where each component's workers run: ``cluster.component_placement`` -> worker specs.

Device ids are per cluster: ``num_nodes * num_devices`` of them, node ``d // num_devices``. A
device is a GPU when the node has GPUs and a CPU core otherwise, so the same recipe runs every
layout on a laptop. On CPU, ``cluster.num_devices`` may exceed the cores (a scaled-down copy
of a GPU layout): device ``d`` then runs on core ``d * cores // num_devices``.

Workers: one per physical device a component holds (a GPU, or a core). Envs are split evenly
over env workers, each holding ``rollout.pipeline_stage_num`` sub-simulators; rollout worker
``r`` generates for env workers ``r, r + R, ...``; actor workers train data-parallel.

    placement = resolve_placement(cfg)          # raises ConfigError naming the key
    placement.mode, placement.workers["env"]    # 'hybrid', [WorkerSpec(...), ...]
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from vla_trainer.config import ConfigError, parse_devices, placement_mode
from vla_trainer.config.schema import TrainConfig

COMPONENTS = ("env", "rollout", "actor")


@dataclass(frozen=True)
class WorkerSpec:
    component: str
    rank: int
    node: int
    device: int
    """GPU index on its node (``kind`` cuda) or CPU core (``kind`` cpu)."""
    kind: str
    share: int
    """Workers (of any component) on this physical device; a GPU is split ``1 / share``."""


@dataclass(frozen=True)
class Placement:
    mode: str
    kind: str
    num_devices: int
    devices: dict[str, tuple[int, ...]]
    """Each component's device ids, as configured."""
    workers: dict[str, tuple[WorkerSpec, ...]]
    envs_per_worker: int
    envs_per_stage: int

    def describe(self) -> str:
        where = "GPU" if self.kind == "cuda" else "core"
        parts = [f"{c} {len(self.workers[c])} worker(s) on {where} "
                 f"{','.join(str(w.device) for w in self.workers[c])}" for c in COMPONENTS]
        return f"{self.mode}: " + "; ".join(parts)


def usable_cores() -> list[int]:
    """The CPU cores this process may run on (respects taskset / cgroup affinity)."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:  # noqa: BLE001  (no CUDA build: CPU devices)
        return 0


def resolve_placement(cfg: TrainConfig, *, gpus: int | None = None, cores: list[int] | None = None) -> Placement:
    """Worker specs of every component. ``gpus`` / ``cores`` describe one node (default: this one).

    Raises:
        ConfigError: device ids out of range, a layout that is neither colocated, disaggregated
            nor hybrid, or envs that do not split evenly over workers and pipeline stages.
    """
    mode = placement_mode(cfg)
    c = cfg.cluster
    gpus = visible_gpus() if gpus is None else gpus
    cores = usable_cores() if cores is None else cores
    kind = "cuda" if gpus > 0 else "cpu"
    per_node = c.num_devices or (gpus if kind == "cuda" else len(cores))
    if kind == "cuda" and per_node > gpus:
        raise ConfigError(f"cluster.num_devices={per_node} but this node has {gpus} GPU(s)")
    total = per_node * c.num_nodes
    p = c.component_placement
    devices: dict[str, tuple[int, ...]] = {}
    for comp in COMPONENTS:
        key = f"cluster.component_placement.{comp}"
        ids = parse_devices(getattr(p, comp), key)
        ids = tuple(range(total)) if ids == "all" else ids
        bad = [d for d in ids if d >= total]
        if bad:
            what = "GPUs" if kind == "cuda" else f"CPU devices (cores: {len(cores)}; set cluster.num_devices to oversubscribe)"
            raise ConfigError(f"{key}={getattr(p, comp)!r}: device id(s) {bad} out of range; this cluster has "
                              f"{total} device(s), ids 0-{total - 1} ({c.num_nodes} node(s) x {per_node} {what})")
        devices[comp] = ids

    def physical(d: int) -> tuple[int, int]:
        node, local = divmod(d, per_node)
        return node, (local if kind == "cuda" else cores[local * len(cores) // per_node])

    slots: dict[str, list[tuple[int, int]]] = {}
    for comp in COMPONENTS:  # one worker per distinct physical device, in device order
        seen: list[tuple[int, int]] = []
        for d in devices[comp]:
            if physical(d) not in seen:
                seen.append(physical(d))
        slots[comp] = seen
    share = {}
    for comp in COMPONENTS:
        for s in slots[comp]:
            share[s] = share.get(s, 0) + 1
    workers = {comp: tuple(WorkerSpec(comp, r, node, dev, kind, share[(node, dev)])
                           for r, (node, dev) in enumerate(slots[comp])) for comp in COMPONENTS}

    n_env, n_roll = len(workers["env"]), len(workers["rollout"])
    envs = cfg.env.train.total_num_envs
    k = cfg.rollout.pipeline_stage_num
    g = cfg.algorithm.group_size
    if envs % n_env:
        raise ConfigError(f"env.train.total_num_envs={envs} does not split over the {n_env} env workers of "
                          f"cluster.component_placement.env={p.env!r}")
    per_worker = envs // n_env
    if per_worker % k:
        raise ConfigError(f"rollout.pipeline_stage_num={k} must divide the {per_worker} envs per env worker "
                          f"(env.train.total_num_envs={envs} over {n_env} env worker(s))")
    per_stage = per_worker // k
    if per_stage % g:
        raise ConfigError(f"algorithm.group_size={g} must divide the {per_stage} envs per pipeline stage "
                          f"(a GRPO group lives in one sub-simulator)")
    if n_env % n_roll:
        raise ConfigError(f"the {n_roll} rollout workers of cluster.component_placement.rollout={p.rollout!r} "
                          f"must divide the {n_env} env workers of cluster.component_placement.env={p.env!r}")
    return Placement(mode, kind, per_node, devices, workers, per_worker, per_stage)
