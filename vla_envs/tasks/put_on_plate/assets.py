"""Asset packs of PutOnPlateInScene25: one directory layout, one loader, two sources.

Layout (the reference's, under ``<pack>/carrot/``)::

    more_carrot/model_db.json          {model_id: {"name", "bbox": {"min", "max"}, "scale", "density"}}
    more_carrot/<model_id>/collision.obj
    more_carrot/<model_id>/textured.{obj,dae,glb}
    more_plate/...                     same as more_carrot
    more_table/model_db.json           {image_file: {"texture": texture_file, "mix": float}}
    more_table/imgs/<image_file>       table photos composited behind robot and objects
    more_table/textures/<texture_file>

Packs live under ``$VLA_ENVS_ASSET_DIR`` (default ``~/.vla_envs/assets``): ``official/`` (the
Bridge real2sim assets; ``vla-envs fetch-assets`` on a machine with internet, see ``fetch.py``)
and ``procedural/`` (generated locally by ``vla_envs.tasks.put_on_plate.procedural``, no
network). Model order in each ``model_db.json`` is the index order the episode ids use.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from vla_envs.errors import AssetsMissingError

PACK_KINDS = ("auto", "official", "procedural")
N_OBJECTS, N_OVERLAYS = 25, 21
VISUAL_FILES = ("textured.obj", "textured.dae", "textured.glb")
FETCH_HINT = ("run `vla-envs fetch-assets` (needs internet; downloads and verifies the reference's carrot/ "
              "folder), or copy that folder (more_carrot, more_plate, more_table) to {root}/official/carrot; "
              "the layout is documented in vla_envs/tasks/put_on_plate/assets.py")


def asset_root() -> Path:
    return Path(os.environ.get("VLA_ENVS_ASSET_DIR", Path.home() / ".vla_envs" / "assets"))


@dataclass(frozen=True)
class ModelInfo:
    """One graspable object or plate."""

    model_id: str
    name: str
    """Words used in the instruction, e.g. ``"carrot"``."""
    collision_file: Path
    visual_file: Path
    bbox_min: np.ndarray
    bbox_max: np.ndarray
    scales: tuple[float, ...]
    density: float

    @property
    def bbox_size(self) -> np.ndarray:
        return self.bbox_max - self.bbox_min


@dataclass(frozen=True)
class Overlay:
    image_file: Path
    texture_file: Path
    mix: float


@dataclass(frozen=True)
class AssetPack:
    kind: str
    """``"official"`` or ``"procedural"``: recorded in every eval report and checkpoint."""
    root: Path
    objects: tuple[ModelInfo, ...]
    plates: tuple[ModelInfo, ...]
    overlays: tuple[Overlay, ...]


def _read_json(path: Path) -> dict:
    if not path.is_file():
        raise AssetsMissingError(f"asset file {path} is missing")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"model database {path} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not data:
        raise ValueError(f"model database {path} must be a non-empty JSON object")
    return data


def _load_models(folder: Path) -> tuple[ModelInfo, ...]:
    db_path = folder / "model_db.json"
    models = []
    for model_id, entry in _read_json(db_path).items():
        where = f"{db_path} entry {model_id!r}"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be an object")
        for field in ("name", "bbox"):
            if field not in entry:
                raise ValueError(f"{where} lacks the field {field!r}")
        bbox = entry["bbox"]
        try:
            lo, hi = np.asarray(bbox["min"], float), np.asarray(bbox["max"], float)
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"{where} field 'bbox' must have 'min' and 'max' 3-vectors") from e
        if lo.shape != (3,) or hi.shape != (3,) or np.any(hi <= lo):
            raise ValueError(f"{where} field 'bbox' must have 3-vectors with max > min")
        scales = entry.get("scale", entry.get("scales", [1.0]))
        scales = tuple(float(s) for s in (scales if isinstance(scales, list) else [scales]))
        model_dir = folder / model_id
        collision = model_dir / "collision.obj"
        visual = next((model_dir / f for f in VISUAL_FILES if (model_dir / f).is_file()), None)
        if not collision.is_file():
            raise AssetsMissingError(f"mesh {collision} (collision of {where}) is missing")
        if visual is None:
            raise AssetsMissingError(f"no visual mesh ({', '.join(VISUAL_FILES)}) in {model_dir}")
        for mesh in (collision, visual):
            if mesh.stat().st_size == 0:
                raise ValueError(f"mesh {mesh} is empty (corrupt pack?)")
        models.append(ModelInfo(model_id, str(entry["name"]), collision, visual, lo, hi,
                                scales, float(entry.get("density", 1000.0))))
    return tuple(models)


def _load_overlays(folder: Path) -> tuple[Overlay, ...]:
    db_path = folder / "model_db.json"
    overlays = []
    for image, entry in _read_json(db_path).items():
        if not isinstance(entry, dict) or "texture" not in entry or "mix" not in entry:
            raise ValueError(f"{db_path} entry {image!r} needs the fields 'texture' and 'mix'")
        img, tex = folder / "imgs" / image, folder / "textures" / entry["texture"]
        for f in (img, tex):
            if not f.is_file():
                raise AssetsMissingError(f"overlay image {f} is missing")
        overlays.append(Overlay(img, tex, float(entry["mix"])))
    return tuple(overlays)


def load_pack(root: Path, kind: str) -> AssetPack:
    """Read and check the pack whose ``carrot/`` folder is under ``root``."""
    base = Path(root) / "carrot"
    if not base.is_dir():
        raise AssetsMissingError(f"no asset pack at {base}")
    pack = AssetPack(kind, Path(root), _load_models(base / "more_carrot"),
                     _load_models(base / "more_plate"), _load_overlays(base / "more_table"))
    if len(pack.objects) < N_OBJECTS or len(pack.overlays) < N_OVERLAYS:
        raise ValueError(f"pack {base} has {len(pack.objects)} objects and {len(pack.overlays)} "
                         f"overlays; the task needs {N_OBJECTS} and {N_OVERLAYS}")
    return pack


def resolve_pack(assets: str = "auto", root: Path | None = None) -> AssetPack:
    """The pack to use: ``"official"`` (error if absent), ``"procedural"`` (generated on first
    use), or ``"auto"`` (official when present, else procedural with one warning)."""
    if assets not in PACK_KINDS:
        raise ValueError(f"assets={assets!r}; allowed: {list(PACK_KINDS)}")
    root = Path(root) if root is not None else asset_root()
    official = root / "official"
    if assets == "official" or (assets == "auto" and (official / "carrot").is_dir()):
        if not (official / "carrot").is_dir():
            raise AssetsMissingError(
                f"assets='official' but no official pack under {official}; "
                + FETCH_HINT.format(root=root))
        return load_pack(official, "official")
    from vla_envs.tasks.put_on_plate.procedural import ensure_procedural_pack

    if assets == "auto":
        _warn_once(f"PutOnPlateInScene25: official Bridge assets not found under {official}; "
                   "using the procedural pack (generated locally). Results on it are not "
                   "comparable to published numbers; " + FETCH_HINT.format(root=root))
    return load_pack(ensure_procedural_pack(root / "procedural"), "procedural")


_WARNED: set[str] = set()


def _warn_once(message: str) -> None:
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, stacklevel=3)
