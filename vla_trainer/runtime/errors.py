"""Errors of the distributed runtime."""


class WorkerFailed(RuntimeError):
    """A Ray worker raised or died; the message names the phase and carries the worker's error."""
