"""Out-of-distribution variants of PutOnPlateInScene25, grouped as in the reference's
evaluation (Vision / Semantic / Execution), each registered as its own env id.

A variant is data: which objects, plates and table photos it draws from, and which
perturbation it applies. The scene code (``env.py``) reads these fields; nothing else
distinguishes variants.
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_envs.tasks.put_on_plate.episodes import UNSEEN_YAWS, Split, pairs_between

CATEGORIES = ("vision", "semantic", "execution")
TRAIN_OBJECTS, TEST_OBJECTS = range(0, 16), range(16, 25)
TRAIN_OVERLAYS, TEST_OVERLAYS = range(0, 16), range(16, 21)
ALL_OVERLAYS = range(0, 21)
UNSEEN_PLATES = "unseen"
"""``Variant.plates``: every plate of the asset pack but the first, the training plate (16 in the
official pack and in the procedural one)."""
PARAPHRASES = (  # 16 unseen phrasings, as many as the reference's test set has (the wording is ours)
    "place the {object} onto the {plate}",
    "move the {object} to the {plate}",
    "pick up the {object} and set it down on the {plate}",
    "can you put the {object} on the {plate}?",
    "the {object} goes on the {plate}",
    "set the {object} on top of the {plate}",
    "grab the {object} and drop it on the {plate}",
    "put the {object} onto the {plate}, please",
    "I want the {object} on the {plate}",
    "transfer the {object} to the {plate}",
    "lift the {object} and place it on the {plate}",
    "get the {object} onto the {plate}",
    "please move the {object} so it rests on the {plate}",
    "take the {object} over to the {plate}",
    "the {plate} needs the {object} on it",
    "could you place the {object} on the {plate}",
)


@dataclass(frozen=True)
class Variant:
    """One evaluation condition. The OOD variants draw what the reference's evaluation draws (its
    ``obj_set="test"``), from our own asset pack and robot."""

    env_id: str
    category: str
    """``"in-distribution"`` or one of ``CATEGORIES``."""
    objects: range = TRAIN_OBJECTS
    plates: range | str = range(0, 1)
    """A range of plate indices, or ``UNSEEN_PLATES``."""
    overlays: range = TRAIN_OVERLAYS
    texture_noise: float = 0.0
    """Dynamic texture noise: the episode's texture image, stretched over the box around the robot
    and objects in view, blended into their pixels with weight ``texture_noise`` x the overlay's
    own ``mix`` (the pack's per-photo noise strength)."""
    image_noise: float = 0.0
    """Whole-image noise: a view-sized window of the episode's texture image at twice the view's
    size, starting at the centre of that box, blended into every pixel with weight
    ``image_noise`` x the overlay's ``mix``."""
    instructions: tuple[str, ...] = ("put {object} on {plate}",)
    """Templates, chosen per episode by its yaw digit and object (deterministic)."""
    distractor: str = ""
    """``"object"`` or ``"plate"``: another of that kind (of this variant's objects or plates, or
    of ``distractors``) on the layout's third cell."""
    distractors: range | str | None = None
    """Where the distractor is drawn from when not from the variant's own objects or plates: a range,
    or ``UNSEEN_PLATES``."""
    layout: str = "grid"
    """Where the object, the plate and a third cell stand (``episodes.LAYOUTS``)."""
    init_qpos_noise_rad: float = 0.0
    """Per-episode offsets of the arm's initial joints (unseen initial pose): every joint moved by half to
    all of this, in a direction drawn per episode id (``episodes.arm_pose_offsets``)."""
    move_object_at_step: int = 0
    """Teleport the object to the layout's third cell at this step, held or not (0: never)."""
    positions: tuple[int, ...] | None = None
    """Indices into the layout the episodes draw from (``None``: all)."""
    yaws: tuple[int, ...] | None = None
    """Indices into ``episodes.YAWS_RAD`` the object's yaw is drawn from (``None``: the 4 training yaws)."""
    parity: int | None = None
    """Only the states of this digit-sum parity (``episodes.Split``): a train / held-out pair."""

    def split(self, n_plates: int = 1) -> Split:
        """The episodes of this variant with a pack of ``n_plates`` plates."""
        def resolve(plates: range | str | None) -> range | None:
            if plates == UNSEEN_PLATES:
                if n_plates < 2:
                    raise ValueError(f"{self.env_id} draws the asset pack's unseen plates, and the pack has "
                                     f"{n_plates} plate(s): at least 2 are needed")
                return range(1, n_plates)
            if plates is not None and plates.stop > n_plates:
                raise ValueError(f"{self.env_id} draws plates {list(plates)}; the asset pack has {n_plates}")
            return plates

        distractors = resolve(self.distractors) if self.distractor == "plate" else self.distractors
        return Split(self.env_id, self.objects, resolve(self.plates), self.overlays, self.positions, self.yaws,
                     self.parity, self.layout, self.distractor, distractors)


def _v(name: str, category: str, **kw) -> Variant:
    return Variant(f"PutOnPlateInScene25{name}-v3", category, **kw)


VARIANTS: dict[str, Variant] = {v.env_id: v for v in [
    _v("Main", "in-distribution"),
    _v("MainTest", "in-distribution", objects=TEST_OBJECTS, overlays=TEST_OVERLAYS),
    # Vision
    _v("VisionImage", "vision", overlays=TEST_OVERLAYS),
    _v("VisionTexture03", "vision", texture_noise=0.3),
    _v("VisionTexture05", "vision", texture_noise=0.5),
    _v("VisionWhole03", "vision", image_noise=0.3),
    _v("VisionWhole05", "vision", image_noise=0.5),
    # Semantic
    _v("Carrot", "semantic", objects=TEST_OBJECTS),
    _v("Plate", "semantic", plates=UNSEEN_PLATES),
    _v("Instruct", "semantic", instructions=PARAPHRASES),
    # the reference's layouts: the extra object more than 15 cm from the object, the extra plate more
    # than 15 cm from the target plate, each more than 7 cm from the other model
    _v("MultiCarrot", "semantic", objects=TEST_OBJECTS, distractor="object", layout="third_far_from_object"),
    _v("MultiPlate", "semantic", plates=UNSEEN_PLATES, overlays=ALL_OVERLAYS, distractor="plate",
       layout="third_far_from_plate"),
    # the reference's two train-set runs, in its semantic category: training objects with another
    # training object ("M-Obj. (IND)"), the training plate with an unseen one beside it ("Dist. Recep.")
    _v("MultiCarrotTrain", "semantic", distractor="object", layout="third_far_from_object"),
    _v("MultiPlateTrain", "semantic", overlays=ALL_OVERLAYS, distractor="plate", distractors=UNSEEN_PLATES,
       layout="third_far_from_plate"),
    # Execution
    _v("Position", "execution", layout="ring", yaws=UNSEEN_YAWS),
    _v("EEPose", "execution", init_qpos_noise_rad=0.15),
    _v("PositionChange", "execution", move_object_at_step=5, layout="third_far_from_object"),
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
        ``(averages, markdown)``; averages per category and the OOD average (``ood_all``: the mean
        of the category averages, as the paper's "Avg." column, so each category weighs the same
        whatever its number of variants), each with ``success_once`` and ``success_at_end`` (and
        ``grasped_once``).
    """
    import numpy as np

    metrics = ("success_once", "success_at_end") + (
        ("grasped_once",) if rows and all("grasped_once" in r for r in rows) else ())
    averages = {}
    for cat in CATEGORIES:
        sel = [r for r in rows if r["category"] == cat]
        if sel:
            averages[cat] = {k: float(np.mean([r[k] for r in sel])) for k in metrics}
    categories = [averages[c] for c in CATEGORIES if c in averages]
    if categories:
        averages["ood_all"] = {k: float(np.mean([c[k] for c in categories])) for k in metrics}
    lines = [header, "", "| variant | category | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]

    def cell(r: dict, k: str) -> str:
        ci = r.get(f"{k}_ci95")
        return f"{r[k]:.3f}" + (f" (95 % CI {ci[0]:.3f}-{ci[1]:.3f})" if ci else "")

    lines += [f"| {r['env_id']} | {r['category']} | " + " | ".join(cell(r, k) for k in metrics) + " |" for r in rows]
    label = {"ood_all": "OOD average (of the 3 categories)"}
    lines += [f"| **{label.get(c, f'{c} average')}** | | " + " | ".join(f"{v[k]:.3f}" for k in metrics) + " |"
              for c, v in averages.items()]
    return averages, "\n".join(lines)
