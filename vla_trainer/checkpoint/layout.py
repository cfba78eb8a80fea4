"""Where a run keeps its training checkpoints: ``checkpoints/iter_XXXXXX/`` folders and
``checkpoints/latest``, a one-line file naming the newest; and ``.lock``, which the one process
training in a run folder holds."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

KEEP_CHECKPOINTS = 2
"""How many of the newest checkpoint folders a run keeps."""


def checkpoint_name(iteration: int) -> str:
    return f"iter_{iteration:06d}"


def checkpoint_folders(ckpt_root: str | Path) -> list[Path]:
    """The ``iter_*`` folders under ``ckpt_root``, oldest first by iteration number (the names' text
    order breaks at a million: ``iter_1000000`` sorts before ``iter_999999``)."""
    def iteration(path: Path) -> tuple[int, str]:
        digits = path.name.removeprefix("iter_")
        return (int(digits), path.name) if digits.isdigit() else (-1, path.name)

    return sorted(Path(ckpt_root).glob("iter_*"), key=iteration)


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    path = pointer.parent / pointer.read_text().strip()
    return path if path.is_dir() else None


RUN_LOCK = ".lock"


@contextlib.contextmanager
def run_folder_lock(run_dir: str | Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock while training there: a second process started on the same folder
    would interleave its records and checkpoints with the first's. The lock is the kernel's
    (``flock``): a process that dies, even by SIGKILL, releases it.

    Raises:
        ValueError: another process holds it (the message names its pid), or the folder cannot be written.
    """
    try:
        import fcntl
    except ImportError:  # no flock (Windows): nothing to hold
        yield
        return
    path = Path(run_dir) / RUN_LOCK
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ValueError(f"the run folder {run_dir} cannot be written: {e.strerror or e} (--run-dir)") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise ValueError(f"{run_dir} is in use: another process (pid {holder}) is training there; wait for it "
                             "to end, or give another folder (--run-dir)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock
