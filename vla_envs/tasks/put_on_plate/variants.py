"""Out-of-distribution variants of PutOnPlateInScene25, grouped as in the reference's
evaluation (Vision / Semantic / Execution), each registered as its own env id.

A variant is data: which objects, plates and table photos it draws from, and which
perturbation it applies. The scene code (``env.py``) reads these fields; nothing else
distinguishes variants.
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_envs.tasks.put_on_plate.episodes import MIN_PAIR_DISTANCE_M, Split, pairs_between, pairs_with_far_cell

CATEGORIES = ("vision", "semantic", "execution")
TRAIN_OBJECTS, TEST_OBJECTS = range(0, 16), range(16, 25)
TRAIN_OVERLAYS, TEST_OVERLAYS = range(0, 16), range(16, 21)
PARAPHRASES = (
    "place the {object} onto the {plate}",
    "move the {object} to the {plate}",
    "pick up the {object} and set it down on the {plate}",
    "can you put the {object} on the {plate}?",
    "the {object} goes on the {plate}",
)


@dataclass(frozen=True)
class Variant:
    """One evaluation condition."""

    env_id: str
    category: str
    """``"in-distribution"`` or one of ``CATEGORIES``."""
    objects: range = TRAIN_OBJECTS
    plates: range = range(0, 1)
    overlays: range = TRAIN_OVERLAYS
    texture_mix: float = 0.0
    """Blend of the episode's texture image into robot/object pixels (dynamic texture noise)."""
    image_mix: float = 0.0
    """Blend of the texture image into the whole image (whole-image noise)."""
    instructions: tuple[str, ...] = ("put {object} on {plate}",)
    """Templates, chosen per episode by its yaw digit and object (deterministic)."""
    distractor: str = ""
    """``"object"`` or ``"plate"``: one more of that kind on the table."""
    far_cell_min_m: tuple[float, float] = (0.0, 0.0)
    """Where the distractor goes, or the object moves to: the grid cell farthest from the object's and
    the plate's start among those more than the first distance from the object and at least the
    second from the plate (``episodes.far_cells``); ``positions`` keeps the pairs that have one."""
    grid_offset_m: float = 0.0
    """Shift of the position grid (unseen positions)."""
    init_qpos_noise_rad: float = 0.0
    """Per-episode offsets of the arm's initial joints (unseen initial pose): every joint moved by half to
    all of this, in a direction drawn per episode id (``episodes.arm_pose_offsets``)."""
    move_object_at_step: int = 0
    """Teleport the object to the far cell at this step, held or not (0: never)."""
    positions: tuple[int, ...] | None = None
    """Indices into ``episodes.position_pairs()`` the episodes draw from (``None``: all 784)."""
    yaws: tuple[int, ...] | None = None
    """Indices into ``episodes.YAWS_RAD`` the object's yaw is drawn from (``None``: all 4)."""
    parity: int | None = None
    """Only the states of this digit-sum parity (``episodes.Split``): a train / held-out pair."""

    def split(self) -> Split:
        return Split(self.env_id, self.objects, self.plates, self.overlays, self.positions, self.yaws,
                     self.parity)


def _v(name: str, category: str, **kw) -> Variant:
    return Variant(f"PutOnPlateInScene25{name}-v3", category, **kw)


VARIANTS: dict[str, Variant] = {v.env_id: v for v in [
    _v("Main", "in-distribution"),
    _v("MainTest", "in-distribution", objects=TEST_OBJECTS, overlays=TEST_OVERLAYS),
    # Vision
    _v("VisionImage", "vision", overlays=TEST_OVERLAYS),
    _v("VisionTexture03", "vision", texture_mix=0.3),
    _v("VisionTexture05", "vision", texture_mix=0.5),
    _v("VisionWhole03", "vision", image_mix=0.3),
    _v("VisionWhole05", "vision", image_mix=0.5),
    # Semantic
    _v("Carrot", "semantic", objects=TEST_OBJECTS),
    _v("Plate", "semantic", plates=range(1, 4)),
    _v("Instruct", "semantic", instructions=PARAPHRASES),
    _v("MultiCarrot", "semantic", distractor="object"),
    # the reference's layouts: the extra plate at least 15 cm from the target plate, the moved object
    # more than 15 cm from where it stood, each more than 7 cm from the other model
    _v("MultiPlate", "semantic", distractor="plate", plates=range(0, 1), far_cell_min_m=(MIN_PAIR_DISTANCE_M, 0.15),
       positions=pairs_with_far_cell(MIN_PAIR_DISTANCE_M, 0.15)),
    # Execution
    _v("Position", "execution", grid_offset_m=0.015),
    _v("EEPose", "execution", init_qpos_noise_rad=0.15),
    _v("PositionChange", "execution", move_object_at_step=5, far_cell_min_m=(0.15, MIN_PAIR_DISTANCE_M),
       positions=pairs_with_far_cell(0.15, MIN_PAIR_DISTANCE_M)),
]}


# Curriculum variants: the task made easier by its own parameters (a fixed plate cell, the object
# on 4 cells 6 cm apart and 9-15 cm from it, one yaw), same scene, robot, camera, reward and
# success. Training draws the even half of the (object, photo, position) checkerboard, its
# held-out twin the odd half: every object, photo and position is in both, no initial state is.
# Not part of the OOD evaluation (``VARIANTS``).
EASY_POSITIONS = pairs_between(object_cells=(6, 8, 18, 20), plate_cells=(17,))
CURRICULUM: dict[str, Variant] = {v.env_id: v for v in [
    _v("Easy", "curriculum", positions=EASY_POSITIONS, yaws=(0,), parity=0),
    _v("EasyHeldOut", "curriculum", positions=EASY_POSITIONS, yaws=(0,), parity=1),
]}


def get_variant(env_id: str) -> Variant:
    known = VARIANTS | CURRICULUM
    if env_id not in known:
        raise ValueError(f"unknown PutOnPlate variant {env_id!r}; valid: {sorted(known)}")
    return known[env_id]


def ood_table(rows: list[dict], header: str) -> tuple[dict, str]:
    """Category averages and a markdown table of per-variant results.

    Args:
        rows: one dict per variant with ``env_id``, ``category``, ``success_once``, ``success_at_end``
            and optionally ``success_once_ci95`` (low, high), shown after success_once, and
            ``grasped_once`` (partial success), a column when every row has it.
        header: the first line (which policy, which asset pack, how many episodes).

    Returns:
        ``(averages, markdown)``; averages per category and over all OOD variants (``ood_all``),
        each with ``success_once`` and ``success_at_end`` (and ``grasped_once``).
    """
    import numpy as np

    metrics = ("success_once", "success_at_end") + (
        ("grasped_once",) if rows and all("grasped_once" in r for r in rows) else ())
    averages = {}
    for cat in CATEGORIES:
        sel = [r for r in rows if r["category"] == cat]
        if sel:
            averages[cat] = {k: float(np.mean([r[k] for r in sel])) for k in metrics}
    ood = [r for r in rows if r["category"] in CATEGORIES]
    if ood:
        averages["ood_all"] = {k: float(np.mean([r[k] for r in ood])) for k in metrics}
    lines = [header, "", "| variant | category | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]

    def cell(r: dict, k: str) -> str:
        ci = r.get(f"{k}_ci95")
        return f"{r[k]:.3f}" + (f" (95 % CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")

    lines += [f"| {r['env_id']} | {r['category']} | " + " | ".join(cell(r, k) for k in metrics) + " |" for r in rows]
    lines += [f"| **{c} average** | | " + " | ".join(f"{v[k]:.3f}" for k in metrics) + " |"
              for c, v in averages.items()]
    return averages, "\n".join(lines)
