"""Writing the package's files atomically: a reader sees the old file or the new one, never half."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def write_json_atomic(path: str | Path, data: dict | list, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``data`` as indented JSON to ``path`` through a temporary file in the same folder.

    Args:
        path: the file; its folder is made if missing.
        data: JSON-ready.
        check: called with the temporary file before it replaces ``path`` (a reader that raises on
            a bad file): a failing check leaves ``path`` as it was.
    """
    return write_bytes_atomic(path, (json.dumps(data, indent=2) + "\n").encode(), check)


def write_bytes_atomic(path: str | Path, data: bytes, check: Callable[[Path], object] | None = None) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same folder (``write_json_atomic``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        # mkstemp makes an owner-only file; the camera file is read by other users (a ROS node's,
        # a container's): the mode a plain write would give, or the replaced file's own
        os.fchmod(fd, path.stat().st_mode & 0o7777 if path.exists() else 0o666 & ~_umask())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())  # on the disk before the name points at it (a power loss)
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _umask() -> int:
    """The process's umask (Linux reports it in /proc; elsewhere it is set and restored)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
