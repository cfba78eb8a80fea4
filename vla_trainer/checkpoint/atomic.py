"""Atomic writes: a folder or a text file is either its previous content or the complete new one.

A folder is filled in a hidden temporary sibling and renamed into place; a crash at any moment
leaves what was there before untouched. The new content is flushed to the disk (fsync) before it
is renamed in, and the rename itself after: a power loss or a host crash cannot leave a name that
points at files the disk never received.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def fsync_path(path: str | Path) -> None:
    """Flush a file's data, or a folder's entries (a rename in it), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(folder: Path) -> None:
    """``fsync_path`` every file and folder under ``folder``, folders after their contents."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            if not os.path.islink(os.path.join(root, name)):
                fsync_path(os.path.join(root, name))
        fsync_path(root)


def write_atomic_dir(out_dir: str | Path, fill: Callable[[Path], None]) -> Path:
    """Calls ``fill(tmp)`` on a fresh temporary folder, then renames it to ``out_dir``.

    ``out_dir`` is either its previous content or the complete new one, never half-written; an
    error or interrupt between moving the previous one aside and renaming the new one in puts the
    previous one back.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{time.time_ns()}"
    tmp.mkdir()
    try:
        fill(tmp)
        fsync_tree(tmp)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{time.time_ns()}"
            out_dir.rename(old)
        try:
            tmp.rename(out_dir)
        except BaseException:
            if old is not None and not out_dir.exists():
                old.rename(out_dir)
            raise
        fsync_path(out_dir.parent)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def write_text_atomic(path: str | Path, text: str) -> None:
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{time.time_ns()}")
    try:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_path(path.parent)
    finally:
        tmp.unlink(missing_ok=True)


def remove_leftovers(folder: str | Path) -> list[Path]:
    """Tidies what a writer killed mid-write left in ``folder``: a hidden ``.NAME.tmp-*`` (a new
    version not finished) is deleted; a ``.NAME.old-*`` (the previous version, moved aside just
    before the new one was renamed in) is deleted when ``NAME`` exists and renamed back to ``NAME``
    when the kill came between the two renames. Call it only where no other writer is busy.
    Returns the leftovers handled."""
    folder = Path(folder)
    found = sorted(folder.glob(".*.tmp-*")) + sorted(folder.glob(".*.old-*"))
    for leftover in found:
        name = leftover.name[1:].rsplit(".", 1)[0]
        if leftover.name.rsplit(".", 1)[1].startswith("old-") and not (folder / name).exists():
            leftover.rename(folder / name)
        elif leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)
    return found
