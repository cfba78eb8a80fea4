"""``RayRuntime``: env, rollout and actor workers as Ray actors placed by the config.

Placement: one Ray placement group per node of the layout (STRICT_PACK), one bundle per physical
device on it (a GPU, or a CPU core); each worker is scheduled into its device's bundle with
``1 / share`` of it, and pins
itself (CPU core affinity, or the GPU Ray assigned). Without ``cluster.ray_address`` (or
``RAY_ADDRESS``) a single-node Ray is started here and shut down at the end; with one, the
workers spread over ``cluster.num_nodes`` of its nodes (the run folder must then be on a
filesystem every node sees, since the actor writes checkpoints).

Fine-grained pipelining (``rollout.pipeline_stage_num`` = k): every env worker holds k
sub-simulators. The driver submits the whole rollout up front as a graph of Ray tasks:

    for t in chunks: for stage s: for env worker e:
        act[t,e,s]  = rollout_worker(e).act(e, s, obs[t,e,s])
        obs[t+1,e,s], record[t,e,s] = env_worker(e).step(s, act[t,e,s])

Each actor runs its tasks in submission order, and a task starts once its inputs exist, so
while env worker e simulates stage s the rollout worker already generates for stage s+1; the
actions move from rollout worker to env worker through the object store, not the driver.
With one stage the two alternate (the disaggregated "bubble"). The data and random draws are
the same for any k: stages are slices of one batch (see ``ChunkVectorEnv(first_env_index=)``
and ``EnvGenerators``), so k changes only the timing.

Faults: an env or rollout worker that dies is restarted by Ray (fresh simulators, the initial
policy) while ``cluster.max_restarts`` allows; it gets the current weights and the interrupted
rollout (or evaluation) runs again from the start. Every random draw of a rollout is keyed by
(seed, iteration, env), so the repeated rollout is the one the death interrupted and the run
stays equal to one without it. An actor worker's death, or any worker's Python error, stops the run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from vla_trainer.config import ConfigError
from vla_trainer.config.schema import TrainConfig
from vla_trainer.rl.rollout import Rollout, RolloutBuffer

from .errors import WorkerDied, WorkerFailed
from .placement import Placement, WorkerSpec, resolve_placement, usable_cores, visible_gpus
from .workers import THREAD_VARS, ActorWorker, EnvWorker, RolloutWorker


STARTUP_TIMEOUT_S = 900
"""How long workers may take to start (import, build models and simulators) before the run fails."""


def _fraction(share: int) -> float:
    return int(10_000 / share) / 10_000  # Ray keeps 4 decimals; never ask for more than the whole


class RayRuntime:
    name = "ray"

    def __init__(self, cfg: TrainConfig, resume_from: Path | None = None, state: dict | None = None):
        import ray

        self.cfg = cfg
        self.placement: Placement = resolve_placement(cfg)
        self.owns_ray = False
        self.actors: list = []
        self.pgs: list = []
        self.workers_replaced = 0
        """Env and rollout workers Ray restarted during the run (at most ``cluster.max_restarts``)."""
        try:
            self._start_ray(ray)
            self._create_workers(ray, resume_from, state)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ setup
    def _start_ray(self, ray) -> None:
        if ray.is_initialized():
            return
        # ray.init puts two SIGTERM handlers of its own in place: a Python one (sys.exit) and, under it,
        # the core worker's crash handler, which aborts the driver (exit -6, nothing closed). A handler
        # the caller set (vla-train's: stop like Ctrl-C, say how to resume) is put back after it.
        on_main_thread = threading.current_thread() is threading.main_thread()
        callers_sigterm = signal.getsignal(signal.SIGTERM) if on_main_thread else None
        try:
            self._init_ray(ray)
        finally:
            if callers_sigterm not in (None, signal.SIG_DFL):
                signal.signal(signal.SIGTERM, callers_sigterm)

    def _init_ray(self, ray) -> None:
        address = self.cfg.cluster.ray_address or os.environ.get("RAY_ADDRESS")
        if address:
            ray.init(address=address, logging_level="WARNING", log_to_driver=True)
        else:
            # a worker importing torch and a simulator on a loaded core can take minutes to register;
            # Ray's 60 s default then kills and respawns it forever (the run would hang)
            os.environ.setdefault("RAY_worker_register_timeout_seconds", str(STARTUP_TIMEOUT_S))
            ray.init(num_cpus=len(usable_cores()), num_gpus=visible_gpus(), include_dashboard=False,
                     logging_level="WARNING", log_to_driver=True)
            self.owns_ray = True

    def _bundles(self, ray) -> dict[tuple[int, int], tuple]:
        """(node, device) of every worker -> (placement group, bundle index). One STRICT_PACK group
        per node of the layout, one bundle per device on it; a node's group needs all its devices
        at once, so two nodes' groups only share a machine that has room for both."""
        from ray.util.placement_group import placement_group

        p = self.placement
        slots = sorted({(w.node, w.device) for ws in p.workers.values() for w in ws})
        unit = {"GPU": 1, "CPU": 1} if p.kind == "cuda" else {"CPU": 1}
        alive = [n for n in ray.nodes() if n["Alive"]]
        if len(alive) < self.cfg.cluster.num_nodes:
            raise ConfigError(f"cluster.num_nodes={self.cfg.cluster.num_nodes} but the Ray cluster has "
                              f"{len(alive)} node(s)")
        index = {}
        for node in sorted({n for n, _ in slots}):
            devices = sorted(d for n, d in slots if n == node)
            pg = placement_group([dict(unit) for _ in devices], strategy="STRICT_PACK")
            self.pgs.append(pg)
            try:
                ray.get(pg.ready(), timeout=120)
            except ray.exceptions.GetTimeoutError:
                raise ConfigError(f"cluster.component_placement: node {node} needs {len(devices)} "
                                  f"{'GPU' if p.kind == 'cuda' else 'CPU'} bundle(s) on one machine and the Ray "
                                  "cluster has none free after 120 s") from None
            index.update({(node, d): (pg, j) for j, d in enumerate(devices)})
        return index

    def _remote(self, ray, cls, spec: WorkerSpec, bundle: tuple, *args, restarts: int = 0):
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        env_vars = {v: "1" for v in THREAD_VARS} if spec.kind == "cpu" else {}
        for v in ("HF_HUB_OFFLINE", "PYTHONHASHSEED", "VLA_ENVS_ASSET_DIR"):
            if v in os.environ:
                env_vars[v] = os.environ[v]
        actor = ray.remote(cls).options(
            num_cpus=_fraction(spec.share), num_gpus=_fraction(spec.share) if spec.kind == "cuda" else 0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(bundle[0], placement_group_bundle_index=bundle[1]),
            runtime_env={"env_vars": env_vars}, name=None, max_restarts=restarts, max_task_retries=0,
            max_concurrency=1,
        ).remote(*args)
        self.actors.append(actor)
        return actor

    def _create_workers(self, ray, resume_from: Path | None, state: dict | None) -> None:
        cfg, p = self.cfg, self.placement
        bundle = self._bundles(ray)
        at = lambda w: bundle[(w.node, w.device)]  # noqa: E731
        n_actor = len(p.workers["actor"])
        G, M = cfg.actor.global_batch_size, cfg.actor.micro_batch_size
        if (G // M) % n_actor:
            raise ConfigError(f"actor.global_batch_size / actor.micro_batch_size = {G // M} micro-batches must "
                              f"split evenly over the {n_actor} actor workers of cluster.component_placement.actor"
                              f"={cfg.cluster.component_placement.actor!r}")
        self.actor_workers = [self._remote(ray, ActorWorker, w, at(w), cfg, w, n_actor,
                                           str(resume_from) if resume_from else None, state)
                              for w in p.workers["actor"]]
        info = self._get(self.actor_workers[0].info.remote(), "actor worker 0", STARTUP_TIMEOUT_S)
        self.chunk_size, self.image_size = info["chunk_size"], info["image_size"]
        R = len(p.workers["rollout"])
        E = len(p.workers["env"])
        restarts = cfg.cluster.max_restarts
        self.rollout_workers = [
            self._remote(ray, RolloutWorker, w, at(w), cfg, w, list(range(r, E, R)), p.envs_per_worker,
                         p.envs_per_stage, restarts=restarts) for r, w in enumerate(p.workers["rollout"])]
        self.env_workers = [self._remote(ray, EnvWorker, w, at(w), cfg, w, p.envs_per_worker, p.envs_per_stage,
                                         self.image_size, restarts=restarts) for w in p.workers["env"]]
        if n_actor > 1:
            address = self._get(self.actor_workers[0].free_address.remote(), "actor worker 0")
            self._get([a.init_group.remote(address) for a in self.actor_workers], "actor workers")
        env_info = self._get([w.info.remote() for w in self.env_workers + self.rollout_workers + self.actor_workers],
                             "the workers", STARTUP_TIMEOUT_S)[0]
        self.asset_pack = env_info["asset_pack"]
        self.worker_pids = self.pids()
        self.num_envs = cfg.env.train.total_num_envs
        self.stages = cfg.rollout.pipeline_stage_num
        self.sync_weights()

    def describe(self) -> str:
        return self.placement.describe() + f", {self.stages} pipeline stage(s), Ray"

    def pids(self) -> list[int]:
        """Process ids of every worker (for checking that none is left behind)."""
        workers = self.env_workers + self.rollout_workers + self.actor_workers
        return [i["pid"] for i in self._get([w.info.remote() for w in workers], "workers")]

    # ------------------------------------------------------------------ the runtime interface
    def _get(self, refs, what: str, timeout: float | None = None):
        import ray

        from vla_trainer.rl.update import NonFiniteLossError

        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise WorkerFailed(f"{what} did not answer within {timeout:.0f} s (workers still starting? an "
                               "overloaded machine, or a cluster without the resources the placement asks for)"
                               ) from None
        except ray.exceptions.RayTaskError as e:
            if isinstance(e.cause, (NonFiniteLossError, ConfigError)):
                raise e.cause from None  # the same error the one-process runtime raises
            if isinstance(e.cause, ray.exceptions.RayActorError):  # a task whose input a dead worker owed
                raise WorkerDied(f"{what} failed: a worker died: {e.cause}") from e
            raise WorkerFailed(f"{what} failed: {e}") from e
        except ray.exceptions.RayActorError as e:
            raise WorkerDied(f"{what} failed: a worker died: {e}") from e

    def _surviving(self, what: str, run):
        """``run()``; when an env or rollout worker died in it and ``cluster.max_restarts`` allows,
        waits for Ray to restart it, hands it the current weights and runs ``run()`` again."""
        while True:
            try:
                return run()
            except WorkerDied as e:
                replaced = self._restarted_workers(e)
                self.workers_replaced += len(replaced)
                if self.workers_replaced > self.cfg.cluster.max_restarts:
                    raise WorkerFailed(f"{e} ({', '.join(replaced)}; cluster.max_restarts="
                                       f"{self.cfg.cluster.max_restarts} restarts allowed, "
                                       f"{self.workers_replaced} needed; resume with runner.resume_dir=auto and a "
                                       "larger cluster.max_restarts to allow more)") from e
                warnings.warn(f"{what}: {', '.join(replaced)} died and was restarted ({self.workers_replaced} of "
                              f"cluster.max_restarts={self.cfg.cluster.max_restarts}); running the {what} again",
                              RuntimeWarning, stacklevel=2)
                self._sync_weights()

    def _restarted_workers(self, error: WorkerDied) -> list[str]:
        """Names of the env and rollout workers whose process changed since the last look, once
        every one answers again. Raises ``error`` when none did (an actor worker died, or Ray
        gave up on the worker: it has no restarts left)."""
        import ray

        names = [f"env worker {i}" for i in range(len(self.env_workers))] + [
            f"rollout worker {i}" for i in range(len(self.rollout_workers))]
        workers = self.env_workers + self.rollout_workers
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        pids = []
        for w in workers:
            while True:
                try:
                    pids.append(ray.get(w.info.remote(), timeout=STARTUP_TIMEOUT_S)["pid"])
                    break
                except ray.exceptions.ActorUnavailableError:  # restarting: Ray refuses calls until it is up
                    if time.monotonic() > deadline:
                        raise error from None
                    time.sleep(0.5)
                except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                    raise error from None
        old = self.worker_pids[:len(workers)]
        replaced = [f"{n} (pid {a} -> {b})" for n, a, b in zip(names, old, pids) if a != b]
        if not replaced:
            raise error
        self.worker_pids = pids + self.worker_pids[len(workers):]
        return replaced

    def rollout(self, key: int) -> Rollout:
        return self._surviving("rollout", lambda: self._rollout(key))

    def _rollout(self, key: int) -> Rollout:
        cfg = self.cfg
        E, R, k = len(self.env_workers), len(self.rollout_workers), self.stages
        T = cfg.rollout.steps_per_rollout // self.chunk_size
        t0 = time.perf_counter()
        for r in self.rollout_workers:
            r.begin.remote(key)
        cur = []
        for w in self.env_workers:
            refs = w.reset.options(num_returns=k).remote(key)
            cur.append(list(refs) if k > 1 else [refs])
        obs_in, acts, recs = [], [], []
        for _ in range(T):
            o_t, a_t, r_t = [], [], []
            for s in range(k):
                for e in range(E):
                    a = self.rollout_workers[e % R].act.remote(e, s, cur[e][s])
                    nxt, rec = self.env_workers[e].step.options(num_returns=2).remote(s, a)
                    o_t.append(cur[e][s])
                    a_t.append(a)
                    r_t.append(rec)
                    cur[e][s] = nxt
            obs_in.append(o_t)
            acts.append(a_t)
            recs.append(r_t)
        tails = [self.rollout_workers[e % R].act.remote(e, s, cur[e][s], True) for s in range(k) for e in range(E)]
        flat = lambda rows: [x for row in rows for x in row]  # noqa: E731
        got = self._get(flat(obs_in) + flat(acts) + flat(recs) + tails, "rollout")
        n = T * k * E
        obs_in, acts, recs, tails = (got[:n], got[n:2 * n], got[2 * n:3 * n], got[3 * n:])
        return self._assemble(T, k, E, obs_in, acts, recs, tails, time.perf_counter() - t0)

    def _assemble(self, T, k, E, obs_in, acts, recs, tails, wall: float) -> Rollout:
        """Task outputs (ordered t, stage, env worker) -> one ``Rollout`` in global env order."""
        # global env order is (env worker, stage): position of (s, e) in a chunk's list -> rank
        order = [s * E + e for e in range(E) for s in range(k)]
        per_t = lambda xs, t: [xs[t * k * E + j] for j in order]  # noqa: E731
        to_t = lambda x: torch.from_numpy(np.array(x))  # noqa: E731
        buffer = RolloutBuffer(T, self.num_envs)
        gen_s = sim_s = 0.0
        for t in range(T):
            o, a, r = per_t(obs_in, t), per_t(acts, t), per_t(recs, t)
            nxt = per_t(acts, t + 1) if t + 1 < T else [tails[j] for j in order]  # they hold V(final obs)
            start = 0
            for obs_out, act, rec, after in zip(o, a, r, nxt):
                obs = obs_out["obs"]
                rows = slice(start, start + len(obs["instruction"]))
                start = rows.stop
                buffer.write(
                    t, rows, instruction=obs["instruction"],
                    episodes={key: np.asarray(v).tolist() for key, v in rec["episodes"].items()},
                    image=np.asarray(obs["image"]),
                    state=np.asarray(obs["state"], dtype=np.float32) if "state" in obs else None,
                    action_token_ids=act["token_ids"], log_probs=act["log_probs"], values=act["values"],
                    final_values=after["final_values"],
                    rewards=to_t(rec["rewards"]).float() * self.cfg.env.train.reward_coef,
                    terminated=to_t(rec["terminated"]), truncated=to_t(rec["truncated"]), valid=to_t(rec["valid"]))
            gen_s += sum(x["seconds"] for x in a)
            sim_s += sum(x["seconds"] for x in r)
        tails = [tails[j] for j in order]
        gen_s += sum(x["seconds"] for x in tails)
        next_values = (torch.zeros(self.num_envs) if tails[0]["next_values"] is None
                       else torch.cat([x["next_values"] for x in tails]))
        return buffer.rollout(next_values, {"generation": gen_s, "simulation": sim_s, "rollout_wall": wall})

    def update(self, rollout, targets, iteration: int) -> dict:
        import ray

        from vla_trainer.rl.update import merge_rank_metrics

        if self.cfg.env.enable_offload:
            for w in self.env_workers:
                w.offload.remote()
        if self.cfg.rollout.enable_offload:
            for r in self.rollout_workers:
                r.offload.remote()
        if self.cfg.actor.enable_offload:
            for a in self.actor_workers:
                a.onload.remote()
        rollout_ref, targets_ref = ray.put(rollout), ray.put(targets)  # stored once, read by every rank
        refs = [a.update.remote(rollout_ref, targets_ref, iteration) for a in self.actor_workers]
        return merge_rank_metrics(self._get(refs, "actor update"))

    def sync_weights(self) -> float:
        return self._surviving("weight sync", self._sync_weights)

    def _sync_weights(self) -> float:
        t0 = time.perf_counter()
        weights = self.actor_workers[0].get_weights.remote()
        refs = []
        for r in self.rollout_workers:
            if self.cfg.rollout.enable_offload:
                r.onload.remote()
            refs.append(r.set_weights.remote(weights))
        self._get(refs, "weight sync")
        if self.cfg.actor.enable_offload:
            self._get([a.offload.remote() for a in self.actor_workers], "actor offload")
        return time.perf_counter() - t0

    def evaluate(self) -> dict:
        return self._surviving("evaluation", lambda: self._get(self.rollout_workers[0].evaluate.remote(),
                                                               "evaluation (rollout worker 0)"))

    def save(self, run_dir: Path, state: dict) -> Path:
        return Path(self._get(self.actor_workers[0].save.remote(str(run_dir), state), "checkpoint (actor worker 0)"))

    def close(self) -> None:
        """Kills every worker and the placement group; shuts down a Ray started here. Never raises:
        it runs on errors and Ctrl-C, when parts of the cluster may already be gone."""
        import ray

        if not ray.is_initialized():
            return
        try:
            if self.actors:
                ray.wait([a.close.remote() for a in self.actors], num_returns=len(self.actors), timeout=30)
        except Exception:  # noqa: BLE001  (a dead worker has nothing left to close)
            pass
        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        self.actors = []
        if self.owns_ray:
            # The placement groups go with the Ray started here. Removing them first would ask its GCS,
            # which a SIGTERM to the whole process group (a scheduler's, `kill -TERM -PGID`) has
            # already ended: Ray then waits 60 s for it and ends the trainer with exit 1.
            self.pgs = []
            ray.shutdown()
            self.owns_ray = False
            return
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:  # a cluster we joined outlives the run: give back what it lent
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
        self.pgs = []
