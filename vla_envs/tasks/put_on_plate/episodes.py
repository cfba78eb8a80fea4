"""Initial states of PutOnPlateInScene25 as data: splits, the position layouts, yaws, and the
mixed-radix ``episode_id`` that indexes them.

An ``episode_id`` of a split decodes, most significant digit first, into
``(object, plate, distractor, overlay, position, yaw)`` with radices
``(n_objects, n_plates, n_distractors, n_overlays, n_positions, n_yaws)``; digits index the
split's ranges and tuples (``n_distractors`` is 1 when the split has none). Train: 16 objects x
1 plate x 16 overlays x 784 positions x 4 yaws = 802,816 ids. Pure numpy; shared by the
simulator, the tests and the eval tools.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

GRID_CENTER_XY = np.array([-0.16, 0.0])
GRID_HALF_EDGE_M = 0.075
GRID_SIDE = 6
MIN_PAIR_DISTANCE_M = 0.070
FAR_M = 0.15
"""How far the third cell of a triplet layout is from the object or the plate it keeps away from."""
YAWS_RAD = np.array([0.0, np.pi / 4, np.pi / 2, 3 * np.pi / 4,
                     -np.pi / 8, -3 * np.pi / 8, -5 * np.pi / 8, -7 * np.pi / 8])
TRAIN_YAWS, UNSEEN_YAWS = (0, 1, 2, 3), (4, 5, 6, 7)
"""Indices into ``YAWS_RAD``: the training yaws, and the ones only the Position variant draws."""
OBJECT_SPAWN_Z = 0.90
PLATE_SPAWN_Z = 0.90


def _cells_xy(steps: np.ndarray, keep: Callable[[float, float], bool] = lambda a, b: True) -> np.ndarray:
    """Cells at grid steps (in units of the grid's edge, 0..1 inside it), row-major, float [n, 2].
    Computed as the reference computes its cells, so that distances of exactly 15 cm fall on the
    same side of its strict comparisons (which decides 2104 triplets rather than 1896 or 2760)."""
    units = np.array([(a, b) for a in steps for b in steps if keep(a, b)])
    return (units * 2 - 1) * GRID_HALF_EDGE_M + GRID_CENTER_XY


def grid_xy() -> np.ndarray:
    """The 6x6 grid of (x, y) positions, float ``[36, 2]``, row-major, around the center."""
    return _cells_xy(np.arange(GRID_SIDE) / (GRID_SIDE - 1))


def ring_xy() -> np.ndarray:
    """The 28 cells one grid step outside the grid (the Position variant's unseen positions),
    float ``[28, 2]``, row-major over the 8x8 grid they border."""
    steps = np.arange(-1, GRID_SIDE + 1) / (GRID_SIDE - 1)
    return _cells_xy(steps, lambda a, b: min(a, b) < 0 or max(a, b) > 1)


def _pairs(cells: np.ndarray) -> np.ndarray:
    pairs = [(a, b) for i, a in enumerate(cells) for j, b in enumerate(cells)
             if i != j and np.linalg.norm(b - a) > MIN_PAIR_DISTANCE_M]
    return np.asarray(pairs)


def position_pairs() -> np.ndarray:
    """Ordered (object, plate) grid positions more than 7 cm apart, float ``[784, 2, 2]``."""
    return _pairs(grid_xy())


def position_triplets(third_from_object_m: float, third_from_plate_m: float) -> np.ndarray:
    """Every (object, plate, third) of grid cells with the object and the plate more than 7 cm
    apart and the third cell more than the given distances from each, float ``[n, 3, 2]``, in
    (object, plate, third) row-major order. The third cell is where a distractor stands or where
    the object is moved to."""
    grid = grid_xy()
    return np.asarray([(a, b, c) for a, b in _pairs(grid) for c in grid
                       if np.linalg.norm(c - b) > third_from_plate_m and np.linalg.norm(a - c) > third_from_object_m])


LAYOUTS: dict[str, Callable[[], np.ndarray]] = {
    "grid": position_pairs,
    "ring": lambda: _pairs(ring_xy()),
    "third_far_from_object": lambda: position_triplets(FAR_M, MIN_PAIR_DISTANCE_M),
    "third_far_from_plate": lambda: position_triplets(MIN_PAIR_DISTANCE_M, FAR_M),
}
"""Position layouts by name: ``"grid"`` (784 object-plate pairs), ``"ring"`` (628 pairs of the
ring cells), and two triplet tables whose third cell is more than 15 cm from the object (and 7 cm
from the plate) or from the plate (and 7 cm from the object): 2104 each."""


@functools.lru_cache(maxsize=None)
def layout_xy(name: str) -> np.ndarray:
    """The layout ``name`` (``LAYOUTS``), float ``[n, 2 or 3, 2]``: (object, plate[, third]) xy."""
    if name not in LAYOUTS:
        raise ValueError(f"unknown position layout {name!r}; valid: {sorted(LAYOUTS)}")
    table = LAYOUTS[name]()
    table.setflags(write=False)
    return table


def pairs_between(object_cells: Sequence[int], plate_cells: Sequence[int]) -> tuple[int, ...]:
    """Indices into ``position_pairs()`` of the pairs whose object stands on one of
    ``object_cells`` and plate on one of ``plate_cells`` (indices into ``grid_xy()``, row-major:
    cell ``6 * i + j`` is x step ``i``, y step ``j``), in ``position_pairs()`` order.

    Raises:
        ValueError: a cell outside the grid, or no pair of these cells is far enough apart.
    """
    n = GRID_SIDE * GRID_SIDE
    bad = [c for c in (*object_cells, *plate_cells) if not 0 <= c < n]
    if bad:
        raise ValueError(f"grid cells {bad} outside 0..{n - 1}")
    xy = grid_xy()
    pairs = position_pairs()
    wanted = {(tuple(xy[a]), tuple(xy[b])) for a in object_cells for b in plate_cells}
    found = tuple(k for k, (a, b) in enumerate(pairs) if (tuple(a), tuple(b)) in wanted)
    if not found:
        raise ValueError(f"no pair of object cells {list(object_cells)} and plate cells {list(plate_cells)} "
                         f"is more than {MIN_PAIR_DISTANCE_M} m apart")
    return found


@dataclass(frozen=True)
class Split:
    """Which objects, plates and table overlays (index ranges), positions and yaws (indices into
    ``layout_xy(layout)`` and ``YAWS_RAD``; ``None``: all positions, the training yaws) a split
    draws from, and whether a distractor (``"object"`` or ``"plate"``, drawn by a digit of its own)
    stands on the layout's third cell: another of the split's objects or plates, or one of
    ``distractors`` (a range of models of that kind the split's own never are).

    ``parity`` (0 or 1) keeps only the combinations whose digits sum to an even (0) or odd
    (1) number: a checkerboard over the product, so the two parities of one product share every
    object, overlay, position and yaw but no initial state (a train / held-out pair).
    """

    name: str
    objects: range
    plates: range
    overlays: range
    positions: tuple[int, ...] | None = None
    yaws: tuple[int, ...] | None = None
    parity: int | None = None
    layout: str = "grid"
    distractor: str = ""
    distractors: range | None = None

    def __post_init__(self):
        if self.distractor not in ("", "object", "plate"):
            raise ValueError(f"split {self.name!r}: distractor must be '', 'object' or 'plate', got {self.distractor!r}")
        if self.distractors is not None:
            own = self.distractor_pool if self.distractor else range(0)
            if not self.distractor or not len(self.distractors) or set(own) & set(self.distractors):
                raise ValueError(f"split {self.name!r}: distractors {list(self.distractors)} must be a non-empty range "
                                 f"of {self.distractor or 'object or plate'}s the split's own are not")
        elif self.distractor and len(self.distractor_pool) < 2:
            raise ValueError(f"split {self.name!r}: a distractor {self.distractor} needs at least two "
                             f"{self.distractor}s, the split has {list(self.distractor_pool)}")
        if self.distractor and layout_xy(self.layout).shape[1] < 3:
            raise ValueError(f"split {self.name!r}: a distractor needs a layout with a third cell, "
                             f"not {self.layout!r}")

    @property
    def distractor_pool(self) -> range:
        """The split's own objects or plates (of the distractor's kind)."""
        return {"object": self.objects, "plate": self.plates}.get(self.distractor, range(0))

    @property
    def n_distractors(self) -> int:
        """Radix of the distractor digit: the other models of the pool, or ``distractors``; 1 without."""
        if not self.distractor:
            return 1
        return len(self.distractors) if self.distractors is not None else len(self.distractor_pool) - 1

    @property
    def position_ids(self) -> np.ndarray:
        n = len(layout_xy(self.layout))
        return np.arange(n) if self.positions is None else np.asarray(self.positions)

    @property
    def yaw_ids(self) -> np.ndarray:
        return np.asarray(TRAIN_YAWS if self.yaws is None else self.yaws)

    @property
    def radices(self) -> tuple[int, int, int, int, int, int]:
        """Of the whole product (before ``parity``)."""
        return (len(self.objects), len(self.plates), self.n_distractors,
                len(self.overlays), len(self.position_ids), len(self.yaw_ids))

    @functools.cached_property
    def product_ids(self) -> np.ndarray | None:
        """With ``parity``: the ids in the whole product of this split's episodes, ascending."""
        if self.parity is None:
            return None
        if self.parity not in (0, 1):
            raise ValueError(f"split {self.name!r}: parity must be 0, 1 or None, got {self.parity!r}")
        ids = np.arange(int(np.prod(self.radices)), dtype=np.int64)
        total = np.zeros_like(ids)
        for r in self.radices[::-1]:
            total += ids % r
            ids //= r
        return np.flatnonzero(total % 2 == self.parity)

    @property
    def num_episodes(self) -> int:
        ids = self.product_ids
        return int(np.prod(self.radices)) if ids is None else len(ids)


SPLITS = {
    "train": Split("train", range(0, 16), range(0, 1), range(0, 16)),
    "test": Split("test", range(16, 25), range(0, 1), range(16, 21)),
    "all": Split("all", range(0, 25), range(0, 1), range(0, 21)),
}


def get_split(name: str, n_plates: int = 1) -> Split:
    """The split ``name`` over ``n_plates`` plates (1 for Main-v3)."""
    if name not in SPLITS:
        raise ValueError(f"unknown split {name!r}; valid splits: {sorted(SPLITS)}")
    s = SPLITS[name]
    return Split(s.name, s.objects, range(0, n_plates), s.overlays)


@dataclass(frozen=True)
class Episode:
    """A decoded initial state: global object/plate/overlay indices, the position (into the
    split's layout), the yaw (into ``YAWS_RAD``), the distractor model (-1: none)."""

    object: int
    plate: int
    overlay: int
    position: int
    yaw: int
    distractor: int = -1


def decode(episode_ids: np.ndarray, split: Split) -> dict[str, np.ndarray]:
    """Episode ids int ``[B]`` -> dict of int ``[B]`` arrays: object, plate, overlay (global
    indices into the pack), position (into ``layout_xy(split.layout)``), yaw (into ``YAWS_RAD``),
    distractor (global index of the other object or plate, -1 without one)."""
    ids = np.asarray(episode_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= split.num_episodes):
        bad = ids[(ids < 0) | (ids >= split.num_episodes)][:5].tolist()
        raise ValueError(f"episode ids {bad} out of range for split {split.name!r} "
                         f"(0..{split.num_episodes - 1})")
    if split.product_ids is not None:
        ids = split.product_ids[ids]
    digits = []
    for r in split.radices[::-1]:
        digits.append(ids % r)
        ids = ids // r
    yaw, position, overlay, extra, plate, obj = digits
    out = {"object": obj + split.objects.start, "plate": plate + split.plates.start,
           "overlay": overlay + split.overlays.start, "position": split.position_ids[position],
           "yaw": split.yaw_ids[yaw], "distractor": np.full_like(obj, -1)}
    if split.distractors is not None:
        out["distractor"] = split.distractors.start + extra
    elif split.distractor:
        pool = split.distractor_pool
        out["distractor"] = pool.start + (out[split.distractor] - pool.start + 1 + extra) % len(pool)
    return out


def arm_pose_offsets(episode_ids: np.ndarray, noise_rad: float) -> np.ndarray:
    """The EEPose variant's initial joint offsets, float ``[B, 7]`` rad: each joint moved by a random
    sign times between half and all of ``noise_rad``, drawn from a generator seeded by the episode id
    (the same id, the same pose; every episode's pose is off the training one, none by a hair)."""
    offsets = []
    for episode_id in np.asarray(episode_ids, dtype=np.int64).tolist():
        rng = np.random.default_rng([episode_id, 0xEE9053])
        offsets.append(rng.choice([-1.0, 1.0], 7) * rng.uniform(0.5, 1.0, 7) * noise_rad)
    return np.asarray(offsets, dtype=np.float64).reshape(-1, 7)


def start_phase_index(episode_ids: np.ndarray, k: int) -> np.ndarray:
    """Which of ``k`` scripted-expert start phases each episode id starts from (``expert_start_phases``):
    the top bits of Knuth's multiplicative hash of the id, so that consecutive ids spread over the
    phases and the choice is independent of every digit, the yaw (the last) included. A function of
    the id, so the episodes of a GRPO group share it. int ``[B]`` -> int ``[B]`` in ``0..k-1``."""
    hashed = (np.asarray(episode_ids, dtype=np.uint64) * np.uint64(2654435761)) % np.uint64(2**32)
    return ((hashed * np.uint64(k)) >> np.uint64(32)).astype(np.int64)


def encode(episode: Episode, split: Split) -> int:
    """The episode id of ``episode`` (global indices) within ``split``."""
    def digit(ids: np.ndarray, value: int, name: str) -> int:
        hit = np.flatnonzero(ids == value)
        if not hit.size:
            raise ValueError(f"{name} {value} outside split {split.name!r}")
        return int(hit[0])

    extra = 0
    if split.distractors is not None:
        if episode.distractor not in split.distractors:
            raise ValueError(f"distractor {episode.distractor} is not one of split {split.name!r}'s "
                             f"{list(split.distractors)}")
        extra = episode.distractor - split.distractors.start
    elif split.distractor:
        pool = split.distractor_pool
        chosen = getattr(episode, split.distractor)
        if episode.distractor not in pool or episode.distractor == chosen:
            raise ValueError(f"distractor {episode.distractor} is not another {split.distractor} of split "
                             f"{split.name!r} ({list(pool)})")
        extra = (episode.distractor - chosen - 1) % len(pool)
    elif episode.distractor != -1:
        raise ValueError(f"split {split.name!r} has no distractor (got {episode.distractor})")
    digits = (episode.object - split.objects.start, episode.plate - split.plates.start, extra,
              episode.overlay - split.overlays.start, digit(split.position_ids, episode.position, "position"),
              digit(split.yaw_ids, episode.yaw, "yaw"))
    for d, r, name in zip(digits[:4], split.radices, ("object", "plate", "distractor", "overlay")):
        if not 0 <= d < r:
            raise ValueError(f"{name} {d} outside split {split.name!r}")
    eid = 0
    for d, r in zip(digits, split.radices):
        eid = eid * r + d
    if split.product_ids is None:
        return int(eid)
    k = int(np.searchsorted(split.product_ids, eid))
    if k == len(split.product_ids) or split.product_ids[k] != eid:
        raise ValueError(f"{episode} is in the other parity of split {split.name!r}")
    return k
