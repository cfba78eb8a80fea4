"""Where a run keeps its training checkpoints: ``checkpoints/iter_XXXXXX/`` folders and
``checkpoints/latest``, a one-line file naming the newest."""

from __future__ import annotations

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
