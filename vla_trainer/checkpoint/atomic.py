"""Atomic writes: a folder or a text file is either its previous content or the complete new one.

A folder is filled in a hidden temporary sibling and renamed into place; a crash at any moment
leaves what was there before untouched.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path


def write_atomic_dir(out_dir: str | Path, fill: Callable[[Path], None]) -> Path:
    """Calls ``fill(tmp)`` on a fresh temporary folder, then renames it to ``out_dir``.

    ``out_dir`` is either its previous content or the complete new one, never half-written.
    """
    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{time.time_ns()}"
    tmp.mkdir()
    try:
        fill(tmp)
        old = None
        if out_dir.exists():
            old = out_dir.parent / f".{out_dir.name}.old-{time.time_ns()}"
            out_dir.rename(old)
        tmp.rename(out_dir)
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
        tmp.write_text(text)
        os.replace(tmp, path)
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
