"""Writing the package's JSON files atomically: a reader sees the old file or the new one, never half."""

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        if check is not None:
            check(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
