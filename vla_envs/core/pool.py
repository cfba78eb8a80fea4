"""``ProcessPoolBackend``: one ``TaskEnv`` per worker process, observations in shared memory.

Why processes: CPU simulators (ManiSkill's PhysX CPU backend, LIBERO/MuJoCo) run one env
per process and are CPU-bound. Why shared memory: an observation batch is megabytes of
images; each worker writes its slot of a preallocated ``[N, ...]`` buffer and only small
scalars (reward, flags) cross the pipe.

Workers are started with ``spawn`` (``fork`` hangs SAPIEN). A worker that raises reports
the error with its env index and traceback and stays alive; a worker that dies is reported
with its exit code, one that stops answering (a step past ``step_timeout_s``) as hung. Either
way the parent raises ``WorkerError`` naming the env, unless ``restart_crashed`` lets it replace
a dead or hung worker and end that env's episode as truncated.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import secrets
import signal
import sys
import traceback
import warnings
from multiprocessing import connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any, Callable

import numpy as np

from vla_envs.core.backend import BatchedBackend, StepResult, stack_env_states
from vla_envs.core.serial import check_same_spaces
from vla_envs.core.spaces import array_keys
from vla_envs.core.task_env import TaskEnv
from vla_envs.errors import VlaEnvError, WorkerError


def shm_block_name() -> str:
    """A name for one shared-memory block, ``vla_<pid>_<random>``: a block left behind after a
    crash is found by ``ls /dev/shm/vla_*`` and traced to the process that made it."""
    return f"vla_{os.getpid()}_{secrets.token_hex(6)}"


def _attach(layout: dict[str, tuple[str, tuple[int, ...], str]]):
    # Spawned workers share the parent's resource tracker, so attaching re-registers the
    # same name (a no-op) and the parent's unlink is the one that counts.
    blocks, views = [], {}
    for key, (name, shape, dtype) in layout.items():
        shm = SharedMemory(name=name)
        blocks.append(shm)
        views[key] = np.ndarray(shape, dtype=np.dtype(dtype), buffer=shm.buf)
    return blocks, views


def _limit_threads(threads: int) -> None:
    """Give each worker its share of the cores: N workers each spawning one render / math
    thread per core oversubscribe the machine (measured: 2 workers on 2 cores, 1.7x -> 1.95x
    of one worker with one thread each). Variables the user set win."""
    for var in ("LP_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, str(threads))


def _worker(index: int, env_fn: Callable[[], TaskEnv], conn: connection.Connection,
            threads: int | None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    if threads is not None:
        _limit_threads(threads)
    env = None
    blocks: list[SharedMemory] = []
    views: dict[str, np.ndarray] = {}
    try:
        env = env_fn()
        if threads is not None and "torch" in sys.modules:
            sys.modules["torch"].set_num_threads(threads)
        conn.send(("ok", (env.observation_space, env.action_space, env.max_episode_steps,
                          env.num_initial_states, tuple(env.progress_flags))))
    except BaseException as e:  # noqa: BLE001 - everything goes back to the parent
        conn.send(("error", _pack_error(e)))
        return
    keys = array_keys(env.observation_space)
    try:
        while True:
            cmd, arg = conn.recv()
            try:
                if cmd == "step":
                    obs, reward, terminated, _, info = env.step(arg)
                    for k in keys:
                        views[k][index] = obs[k]
                    conn.send(("ok", (float(reward), bool(terminated), bool(info["success"]),
                                      tuple(bool(info[name]) for name in env.progress_flags))))
                elif cmd == "reset":
                    obs, _ = env.reset(options={"state_id": int(arg)})
                    for k in keys:
                        views[k][index] = obs[k]
                    conn.send(("ok", obs["instruction"]))
                elif cmd == "attach":
                    blocks, views = _attach(arg)
                    conn.send(("ok", None))
                elif cmd == "expert_state":  # None: the task has no privileged state
                    conn.send(("ok", env.expert_state() if hasattr(env, "expert_state") else None))
                elif cmd == "call":
                    name, args, kwargs = arg
                    conn.send(("ok", getattr(env, name)(*args, **kwargs)))
                elif cmd == "close":
                    break
                else:
                    raise ValueError(f"unknown worker command {cmd!r}")
            except Exception as e:  # noqa: BLE001 - report, keep serving
                conn.send(("error", _pack_error(e)))
    except (EOFError, KeyboardInterrupt, BrokenPipeError):
        pass
    finally:
        if env is not None:
            env.close()
        views = {}
        for shm in blocks:
            shm.close()
        conn.close()


def _pack_error(e: BaseException) -> tuple[Any, str, str]:
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    # Our own errors carry the user-facing fix (install command, asset path): keep them whole.
    return (e if isinstance(e, VlaEnvError) else None, f"{type(e).__name__}: {e}", tb)


class ProcessPoolBackend(BatchedBackend):
    """Runs each ``TaskEnv`` in its own process.

    Args:
        env_fns: one picklable factory per env (e.g. ``functools.partial`` of a module-level
            function).
        context: multiprocessing start method, ``"spawn"`` (default) or ``"forkserver"``.
        start_timeout_s: how long a worker may take to build its env.
        step_timeout_s: how long one step or reset may take before the worker is declared hung.
        threads_per_worker: CPU threads each worker's renderer and torch may use; default
            ``max(1, cpu_count // num_envs)``. None leaves the libraries' defaults.
        restart_crashed: a worker process that dies while stepping (segfault, OOM kill) or
            hangs (no answer within ``step_timeout_s``; it is killed) is replaced by a fresh one
            and ``step`` reports the env in ``info["crashed"]`` (the vector env ends its episode
            as truncated) instead of raising; one that dies or hangs while resetting is replaced
            and the reset retried once. A worker that raises a Python exception is never
            restarted: its error is raised.
    """

    can_skip_envs = True

    def __init__(self, env_fns: list[Callable[[], TaskEnv]], context: str = "spawn",
                 start_timeout_s: float = 300.0, step_timeout_s: float = 300.0,
                 threads_per_worker: int | None | str = "auto", restart_crashed: bool = False):
        if not env_fns:
            raise ValueError("num_envs must be >= 1")
        if context not in ("spawn", "forkserver"):
            raise ValueError(f"context={context!r}; allowed: 'spawn', 'forkserver' ('fork' hangs simulators)")
        self.num_envs = len(env_fns)
        self.step_timeout_s = step_timeout_s
        self._closed = False
        self._blocks: list[SharedMemory] = []
        if threads_per_worker == "auto":
            threads_per_worker = max(1, (os.cpu_count() or 1) // self.num_envs)
        self._ctx = mp.get_context(context)
        self._env_fns, self._threads = list(env_fns), threads_per_worker
        self.start_timeout_s, self.restart_crashed = start_timeout_s, bool(restart_crashed)
        self.restarts = 0
        self._unreset: set[int] = set()
        """Restarted workers not reset since: stepping them would step a simulator with no episode."""
        self._conns: list[connection.Connection] = []
        self._procs: list[mp.process.BaseProcess] = []
        for i in range(self.num_envs):
            self._conns.append(None)
            self._procs.append(None)
            self._spawn(i)
        try:
            specs = [self._recv(i, _STARTING, start_timeout_s) for i in range(self.num_envs)]
            check_same_spaces([s[:2] for s in specs])
            (self.single_observation_space, self.single_action_space,
             self.max_episode_steps, self.num_initial_states, self.progress_flags) = specs[0]
            self._keys = array_keys(self.single_observation_space)
            layout = {}
            for k in self._keys:
                space = self.single_observation_space[k]
                shape = (self.num_envs,) + space.shape
                shm = SharedMemory(create=True, name=shm_block_name(),
                                   size=max(1, int(np.prod(shape)) * space.dtype.itemsize))
                self._blocks.append(shm)
                layout[k] = (shm.name, shape, space.dtype.str)
            self._views = {k: np.ndarray(layout[k][1], np.dtype(layout[k][2]), buffer=b.buf)
                           for k, b in zip(self._keys, self._blocks)}
            self._layout = layout
            for i in range(self.num_envs):
                self._conns[i].send(("attach", layout))
            for i in range(self.num_envs):
                self._recv(i, "attaching shared memory", start_timeout_s)
        except BaseException:
            self.close()
            raise

    def _spawn(self, i: int) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(i, self._env_fns[i], child, self._threads),
                                 name=f"vla-env-worker-{i}", daemon=True)
        with _main_module_hidden(self._env_fns[i]):
            proc.start()
        child.close()
        self._conns[i], self._procs[i] = parent, proc

    def _restart(self, i: int, error: WorkerError) -> None:
        """Replaces dead worker ``i`` with a fresh one attached to the same shared memory."""
        warnings.warn(f"{error}; restarting it (its episode ends as truncated)", RuntimeWarning, stacklevel=3)
        self._procs[i].join(1)
        self._conns[i].close()
        self._spawn(i)
        self._recv(i, _STARTING, self.start_timeout_s)
        self._conns[i].send(("attach", self._layout))
        self._recv(i, "attaching shared memory", self.start_timeout_s)
        self._unreset.add(i)
        self.restarts += 1

    def _died(self, i: int, error: BaseException) -> bool:
        """Whether ``error`` is worker ``i``'s death or hang and a restart may replace it; a hung
        worker is killed here."""
        if not (self.restart_crashed and isinstance(error, WorkerError)):
            return False
        proc = self._procs[i]
        return not proc.is_alive() and proc.exitcode is not None

    # -------------------------------------------------------------- protocol
    def _recv(self, i: int, doing: str, timeout_s: float | None = None) -> Any:
        conn, proc = self._conns[i], self._procs[i]
        ready = connection.wait([conn, proc.sentinel], timeout=timeout_s or self.step_timeout_s)
        if conn not in ready:
            if proc.sentinel in ready or not proc.is_alive():
                proc.join(1)
                raise self._death(i, doing)
            # killed: its late answer would otherwise be read as the answer to the next command
            proc.kill()  # SIGKILL also ends a stopped process
            proc.join(5)
            raise WorkerError(f"env worker {i} (pid {proc.pid}) did not answer within "
                              f"{timeout_s or self.step_timeout_s:g} s while {doing}; it was killed",
                              env_index=i, hung=True)
        try:
            status, payload = conn.recv()
        except (EOFError, ConnectionError):
            proc.join(1)
            raise self._death(i, doing) from None
        if status == "error":
            original, summary, tb = payload
            if original is not None:
                raise original
            raise WorkerError(f"env worker {i} failed while {doing}: {summary}\n"
                              f"--- worker traceback ---\n{tb}", env_index=i)
        return payload

    def _gather(self, ids: np.ndarray, doing: str) -> list[Any]:
        """Receive one answer from each worker in ``ids``; raise the first failure after
        draining the others so the pipes stay in step."""
        results, first_error = [], None
        for i in ids:
            try:
                results.append(self._recv(int(i), doing))
            except BaseException as e:  # noqa: BLE001
                results.append(None)
                if first_error is None:
                    first_error = e
        if first_error is not None:
            raise first_error
        return results

    def _send(self, i: int, msg: tuple, doing: str) -> None:
        try:
            self._conns[i].send(msg)
        except (BrokenPipeError, ConnectionError, OSError):
            proc = self._procs[i]
            proc.join(1)
            raise WorkerError(f"env worker {i} (pid {proc.pid}) died before {doing}: "
                              f"{_describe_exit(proc.exitcode)}", env_index=i) from None

    def _send_all(self, ids: np.ndarray, msgs: list[tuple], doing: str) -> list[int]:
        """Sends each worker its message; returns those found dead (restart_crashed only). A death
        that cannot be restarted is raised after the others' answers are read: the pipes stay in step."""
        dead, sent, first_error = [], [], None
        for i, msg in zip(ids, msgs):
            try:
                self._send(int(i), msg, doing)
                sent.append(int(i))
            except WorkerError as e:
                if self._died(int(i), e):
                    dead.append(int(i))
                elif first_error is None:
                    first_error = e
        if first_error is not None:
            try:
                self._gather(np.array(sent, np.int64), doing)
            except BaseException:  # noqa: BLE001  the first failure is the one to report
                pass
            raise first_error
        return dead

    def _death(self, i: int, doing: str) -> WorkerError:
        """The error that names worker ``i``'s death while ``doing``, with how it exited."""
        proc = self._procs[i]
        return WorkerError(f"env worker {i} (pid {proc.pid}) died while {doing}: {_describe_exit(proc.exitcode)}",
                           env_index=i)

    def _gather_crashes(self, ids: np.ndarray, doing: str, dead: list[int]) -> tuple[list[Any], list[int]]:
        """Like ``_gather``, but workers that died or hung are restarted and listed instead of raising."""
        results, first_error, crashed = [], None, {}
        for i in map(int, ids):
            if i in dead:
                results.append(None)
                crashed[i] = self._death(i, doing)
                continue
            try:
                results.append(self._recv(i, doing))
            except BaseException as e:  # noqa: BLE001
                results.append(None)
                if self._died(i, e):
                    crashed[i] = e if e.hung else self._death(i, doing)
                elif first_error is None:
                    first_error = e
        if first_error is not None:
            raise first_error
        for i, error in crashed.items():
            self._restart(i, error)
        return results, list(crashed)

    def reset(self, env_ids: np.ndarray, state_ids: np.ndarray):
        msgs = [("reset", int(sid)) for sid in state_ids]
        dead = self._send_all(env_ids, msgs, "resetting")
        instructions, crashed = self._gather_crashes(env_ids, "resetting", dead)
        if crashed:  # a fresh worker gets one more try; a second death raises
            pos = [list(map(int, env_ids)).index(i) for i in crashed]
            for i, p in zip(crashed, pos):
                self._send(i, msgs[p], "resetting")
            for i, p in zip(crashed, pos):
                instructions[p] = self._recv(i, "resetting")
        self._unreset.difference_update(map(int, env_ids))
        return {k: self._views[k][env_ids].copy() for k in self._keys}, instructions

    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        n = self.num_envs
        ids = np.array([i for i in np.flatnonzero(active) if i not in self._unreset], np.int64)
        dead = self._send_all(ids, [("step", actions[i]) for i in ids], "stepping")
        answers, crashed = self._gather_crashes(ids, "stepping", dead)
        reward, terminated, success = np.zeros(n, np.float32), np.zeros(n, bool), np.zeros(n, bool)
        info = {name: np.zeros(n, bool) for name in self.progress_flags}
        for i, answer in zip(ids, answers):
            if answer is not None:
                reward[i], terminated[i], success[i], flags = answer
                for name, flag in zip(self.progress_flags, flags):
                    info[name][i] = flag
        if crashed:
            info["crashed"] = np.zeros(n, bool)
            info["crashed"][crashed] = True
        return StepResult(self._views, reward, terminated, success, info)

    def call(self, env_index: int, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` on the ``TaskEnv`` of one worker and return its (picklable) result."""
        self._send(env_index, ("call", (method, args, kwargs)), f"calling {method}")
        return self._recv(env_index, f"calling {method}")

    def expert_state(self) -> dict[str, np.ndarray]:
        """Every worker's ``TaskEnv.expert_state()``, asked of all at once, stacked ``[N, ...]``."""
        ids = np.arange(self.num_envs)
        for i in ids:
            self._send(int(i), ("expert_state", None), "reading the expert state")
        states = self._gather(ids, "reading the expert state")
        if any(state is None for state in states):
            return super().expert_state()
        return stack_env_states(states)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for conn, proc in zip(self._conns, self._procs):
            if proc.is_alive():
                try:
                    conn.send(("close", None))
                except (BrokenPipeError, ConnectionError, OSError):
                    pass
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for conn in self._conns:
            conn.close()
        self._views = {}
        for shm in self._blocks:
            shm.close()
            shm.unlink()
        self._blocks = []

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


@contextlib.contextmanager
def _main_module_hidden(env_fn: Callable[[], TaskEnv]):
    """Start a worker without re-running the user's script in it.

    ``spawn`` (and ``forkserver``) make a child import the parent's ``__main__`` module first, so a
    plain script that calls ``gym.make(...)`` at its top level (the README's first lines) would
    make every worker build envs again, and fail. Our workers need nothing from ``__main__``:
    while one starts, ``__main__`` shows no file or module name, so the child skips that import.
    When the env factory itself lives in ``__main__`` (a user's own ``TaskEnv`` in their script)
    the child needs it, and the script is imported as multiprocessing always does.
    """
    import pickle

    main = sys.modules.get("__main__")
    try:
        needs_main = b"__main__" in pickle.dumps(env_fn)
    except Exception:  # noqa: BLE001  unpicklable here: let multiprocessing report it as usual
        needs_main = True
    if main is None or needs_main:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


_STARTING = (
    "starting (its stderr above has the cause; a script whose own env factory is defined in it, and "
    "that creates envs at import time, must do so under `if __name__ == \"__main__\":`: such workers "
    "import the script)"
)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by signal {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
