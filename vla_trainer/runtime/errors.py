"""Errors of the distributed runtime."""


class WorkerFailed(RuntimeError):
    """A Ray worker raised or died; the message names the phase and carries the worker's error."""


class WorkerDied(WorkerFailed):
    """A Ray worker's process died (killed, OOM, segfault), as opposed to raising an error; an env or
    rollout worker that died may be restarted (``cluster.max_restarts``)."""
