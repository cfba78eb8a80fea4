"""The procedural asset pack: 25 named graspable objects, 17 plates and 21 table-photo-like
overlays, generated deterministically from code (no network), in the official layout.

Objects are simple solids (tapered cones, capsules, ellipsoids, boxes) sized like the
Bridge carrots (5-11 cm long, graspable by a parallel gripper), each with its own colour and
name. Overlays are synthetic table surfaces (wood grain, fabric, stone) at 640x480.
Bump ``VERSION`` whenever the output changes: packs of another version are regenerated.
"""

from __future__ import annotations

import fcntl
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np

VERSION = 3

# name, shape, (length, width, height) in metres, RGB colour
OBJECTS: list[tuple[str, str, tuple[float, float, float], tuple[int, int, int]]] = [
    ("carrot", "cone", (0.090, 0.026, 0.026), (237, 112, 20)),
    ("orange carrot", "cone", (0.075, 0.030, 0.030), (250, 140, 30)),
    ("purple carrot", "cone", (0.085, 0.024, 0.024), (120, 40, 120)),
    ("yellow carrot", "cone", (0.080, 0.026, 0.026), (240, 200, 40)),
    ("cucumber", "capsule", (0.100, 0.030, 0.030), (40, 120, 40)),
    ("zucchini", "capsule", (0.110, 0.032, 0.032), (70, 140, 50)),
    ("eggplant", "ellipsoid", (0.090, 0.040, 0.040), (80, 30, 90)),
    ("banana", "capsule", (0.100, 0.028, 0.026), (245, 220, 60)),
    ("corn", "capsule", (0.095, 0.034, 0.034), (250, 210, 80)),
    ("sweet potato", "ellipsoid", (0.085, 0.038, 0.034), (170, 80, 60)),
    ("red pepper", "ellipsoid", (0.060, 0.045, 0.045), (200, 30, 30)),
    ("green pepper", "ellipsoid", (0.060, 0.045, 0.045), (50, 150, 40)),
    ("lemon", "ellipsoid", (0.060, 0.042, 0.042), (250, 235, 70)),
    ("lime", "ellipsoid", (0.050, 0.040, 0.040), (120, 190, 50)),
    ("radish", "cone", (0.060, 0.030, 0.030), (210, 40, 80)),
    ("parsnip", "cone", (0.095, 0.028, 0.028), (235, 225, 190)),
    # test split (objects 16-24): unseen during training
    ("celery stick", "box", (0.100, 0.022, 0.018), (150, 200, 110)),
    ("butter block", "box", (0.070, 0.035, 0.025), (250, 240, 160)),
    ("sausage", "capsule", (0.090, 0.026, 0.026), (160, 70, 50)),
    ("pear", "ellipsoid", (0.070, 0.045, 0.045), (200, 210, 80)),
    ("plum", "ellipsoid", (0.050, 0.042, 0.042), (90, 30, 70)),
    ("white radish", "cone", (0.100, 0.032, 0.032), (240, 240, 235)),
    ("blue marker", "capsule", (0.110, 0.020, 0.020), (40, 70, 200)),
    ("tofu block", "box", (0.065, 0.040, 0.028), (245, 245, 230)),
    ("chili pepper", "cone", (0.080, 0.018, 0.018), (220, 20, 20)),
]
# name, radius (m), RGB colour; the first one is Main-v3's plate, the other 16 the unseen plates
# of the Plate and MultiPlate variants (as many as the official pack's). Radius + the success test's
# 1 cm xy margin stays below the grid's 7 cm minimum object-plate distance, so no initial state
# counts as solved before the robot has moved.
PLATES: list[tuple[str, float, tuple[int, int, int]]] = [
    ("plate", 0.058, (235, 235, 240)),
    ("blue plate", 0.055, (90, 130, 210)),
    ("green plate", 0.059, (120, 180, 120)),
    ("black plate", 0.057, (40, 40, 45)),
    ("red plate", 0.056, (200, 50, 45)),
    ("yellow plate", 0.058, (240, 210, 70)),
    ("orange plate", 0.055, (240, 140, 50)),
    ("purple plate", 0.057, (130, 80, 170)),
    ("pink plate", 0.059, (240, 160, 190)),
    ("grey plate", 0.056, (140, 140, 145)),
    ("brown plate", 0.058, (120, 80, 50)),
    ("teal plate", 0.055, (40, 150, 150)),
    ("cream plate", 0.060, (245, 230, 200)),
    ("navy plate", 0.057, (30, 40, 110)),
    ("olive plate", 0.056, (130, 130, 50)),
    ("light blue plate", 0.059, (160, 200, 240)),
    ("maroon plate", 0.058, (120, 30, 40)),
]
N_OVERLAYS = 21
OVERLAY_HW = (480, 640)


def _mesh(shape: str, size: tuple[float, float, float]):
    import trimesh

    length, width, height = size
    if shape == "cone":
        m = trimesh.creation.cone(radius=width / 2, height=length, sections=24)
        m.apply_translation([0, 0, -length / 2])
        m.apply_transform(trimesh.transformations.rotation_matrix(np.pi / 2, [0, 1, 0]))
    elif shape == "capsule":
        r = width / 2
        m = trimesh.creation.capsule(height=max(length - 2 * r, 1e-3), radius=r, count=[16, 16])
        m.apply_transform(trimesh.transformations.rotation_matrix(np.pi / 2, [0, 1, 0]))
        m.apply_scale([1.0, 1.0, height / width])
    elif shape == "ellipsoid":
        m = trimesh.creation.icosphere(subdivisions=3, radius=0.5)
        m.apply_scale([length, width, height])
    elif shape == "box":
        m = trimesh.creation.box(extents=[length, width, height])
    else:
        raise ValueError(f"unknown shape {shape!r}")
    m.apply_translation(-m.bounds.mean(axis=0))
    return m


def _plate_meshes(radius: float):
    import trimesh

    base = trimesh.creation.cylinder(radius=radius, height=0.012, sections=48)
    rim = trimesh.creation.annulus(r_min=radius * 0.88, r_max=radius, height=0.022, sections=48)
    rim.apply_translation([0, 0, 0.005])
    visual = trimesh.util.concatenate([base, rim])
    return visual, base  # the collision is the flat disc: one convex piece


def _write_obj(path: Path, mesh, rgb: tuple[int, int, int]) -> None:
    """OBJ + MTL with one diffuse colour (what SAPIEN's loader reads for a plain material)."""
    mtl = path.with_suffix(".mtl")
    r, g, b = (c / 255 for c in rgb)
    mtl.write_text(f"newmtl base\nKd {r:.4f} {g:.4f} {b:.4f}\nKa 0 0 0\nKs 0.1 0.1 0.1\nNs 10\n")
    lines = [f"mtllib {mtl.name}", "usemtl base"]
    lines += [f"v {x:.6f} {y:.6f} {z:.6f}" for x, y, z in mesh.vertices]
    lines += [f"vn {x:.6f} {y:.6f} {z:.6f}" for x, y, z in mesh.vertex_normals]
    lines += [f"f {a}//{a} {b}//{b} {c}//{c}" for a, b, c in (mesh.faces + 1)]
    path.write_text("\n".join(lines) + "\n")


def _write_model(folder: Path, model_id: str, visual, collision, rgb) -> dict:
    d = folder / model_id
    d.mkdir(parents=True)
    _write_obj(d / "textured.obj", visual, rgb)
    _write_obj(d / "collision.obj", collision.convex_hull, rgb)
    lo, hi = visual.bounds
    return {"bbox": {"min": lo.round(6).tolist(), "max": hi.round(6).tolist()}}


def _overlay_image(rng: np.random.Generator, kind: str) -> np.ndarray:
    """A synthetic table photo, uint8 [480, 640, 3]: a surface with grain, lit unevenly."""
    h, w = OVERLAY_HW
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    base = rng.uniform(60, 210, size=3)
    if kind == "wood":
        freq, angle = rng.uniform(0.02, 0.06), rng.uniform(-0.3, 0.3)
        u = xx * np.cos(angle) + yy * np.sin(angle)
        warp = 12 * np.sin(yy / rng.uniform(40, 90) + rng.uniform(0, 6))
        pattern = 0.5 + 0.5 * np.sin(freq * (u + warp))
        tex = 0.75 + 0.25 * pattern
    elif kind == "fabric":
        p = rng.uniform(4, 9)
        tex = 0.85 + 0.15 * (np.sin(xx / p) * np.sin(yy / p))
    else:  # stone
        coarse = rng.uniform(0, 1, size=(h // 32 + 1, w // 32 + 1)).astype(np.float32)
        tex = 0.8 + 0.2 * np.kron(coarse, np.ones((32, 32), np.float32))[:h, :w]
    noise = rng.normal(0, 0.04, size=(h, w)).astype(np.float32)
    light = 1.0 - 0.35 * ((yy / h - rng.uniform(0.2, 0.8)) ** 2 + (xx / w - rng.uniform(0.2, 0.8)) ** 2)
    img = base[None, None, :] * (tex + noise)[..., None] * light[..., None]
    return np.clip(img, 0, 255).astype(np.uint8)


def generate_pack(root: Path) -> None:
    """Write the procedural pack under ``root/carrot`` (``root`` must not exist)."""
    from PIL import Image

    base = Path(root) / "carrot"
    objects_db, plates_db, table_db = {}, {}, {}
    for i, (name, shape, size, rgb) in enumerate(OBJECTS):
        model_id = f"{i:03d}_{name.replace(' ', '_')}"
        m = _mesh(shape, size)
        objects_db[model_id] = {"name": name, **_write_model(base / "more_carrot", model_id, m, m, rgb),
                                "scale": [1.0], "density": 600.0}
    for i, (name, radius, rgb) in enumerate(PLATES):
        model_id = f"{i:03d}_{name.replace(' ', '_')}"
        visual, collision = _plate_meshes(radius)
        plates_db[model_id] = {"name": name, **_write_model(base / "more_plate", model_id, visual, collision, rgb),
                               "scale": [1.0], "density": 1000.0}
    (base / "more_table" / "imgs").mkdir(parents=True)
    (base / "more_table" / "textures").mkdir(parents=True)
    rng = np.random.default_rng(20250101)
    for i in range(N_OVERLAYS):
        kind = ("wood", "fabric", "stone")[i % 3]
        image, texture = f"table_{i:02d}.png", f"texture_{i:02d}.png"
        Image.fromarray(_overlay_image(rng, kind)).save(base / "more_table" / "imgs" / image)
        Image.fromarray(_overlay_image(rng, "stone")).save(base / "more_table" / "textures" / texture)
        table_db[image] = {"texture": texture, "mix": round(float(rng.uniform(0.0, 0.3)), 3)}
    for folder, db in (("more_carrot", objects_db), ("more_plate", plates_db), ("more_table", table_db)):
        (base / folder / "model_db.json").write_text(json.dumps(db, indent=1))
    (Path(root) / "pack.json").write_text(json.dumps({"kind": "procedural", "version": VERSION}))


def _is_current(root: Path) -> bool:
    try:
        return json.loads((root / "pack.json").read_text()).get("version") == VERSION
    except (json.JSONDecodeError, OSError):
        return False


def ensure_procedural_pack(root: Path) -> Path:
    """Generate the pack at ``root`` unless a pack of this ``VERSION`` is there; returns root.

    Generation holds a lock file beside ``root``, so of concurrent callers (env workers starting
    together) one generates and the others then find its pack; none replaces a pack another
    may be reading. It writes to a temporary sibling and renames it into place, so an
    interrupted run never leaves a half-written pack behind."""
    root = Path(root)
    if _is_current(root):
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if _is_current(root):  # a concurrent caller made it while this one waited
            return root
        tmp = Path(tempfile.mkdtemp(prefix=".procedural-", dir=root.parent))
        try:
            generate_pack(tmp / "pack")
            if root.exists():  # an older version or an incomplete pack
                shutil.rmtree(root)
            (tmp / "pack").rename(root)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return root
