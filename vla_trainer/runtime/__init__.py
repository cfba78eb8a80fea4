"""Where env, rollout and actor run: in this process (``local``) or as placed Ray workers (``ray``).

    runtime = make_runtime(cfg)        # by cluster.runtime
    rollout = runtime.rollout(key); metrics = runtime.update(rollout, targets, it); runtime.sync_weights()
"""

from __future__ import annotations

from pathlib import Path

from vla_trainer.config.schema import TrainConfig

from .placement import COMPONENTS, Placement, WorkerSpec, resolve_placement


def make_runtime(cfg: TrainConfig, resume_from: Path | None = None, state: dict | None = None):
    """The runtime ``cluster.runtime`` names, with the model (and optimizer state) of ``resume_from``."""
    if cfg.cluster.runtime == "local":
        from .local import LocalRuntime

        return LocalRuntime(cfg, resume_from, state)
    from .ray_runtime import RayRuntime

    return RayRuntime(cfg, resume_from, state)


__all__ = ["COMPONENTS", "Placement", "WorkerSpec", "make_runtime", "resolve_placement"]
