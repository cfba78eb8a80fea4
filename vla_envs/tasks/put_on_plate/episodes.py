"""Initial states of PutOnPlateInScene25 as data: splits, the position grid, yaws, and the
mixed-radix ``episode_id`` that indexes them.

An ``episode_id`` of a split decodes, most significant digit first, into
``(object, plate, overlay, position pair, yaw)`` with radices
``(n_objects, n_plates, n_overlays, n_position_pairs, n_yaws)``; digits index the split's
ranges and tuples. Train: 16 objects x 1 plate x 16 overlays x 784 pairs x 4 yaws = 802,816 ids.
Pure numpy; shared by the simulator, the tests and the eval tools.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

GRID_CENTER_XY = np.array([-0.16, 0.0])
GRID_HALF_EDGE_M = 0.075
GRID_SIDE = 6
MIN_PAIR_DISTANCE_M = 0.070
YAWS_RAD = np.array([0.0, np.pi / 4, np.pi / 2, 3 * np.pi / 4])
OBJECT_SPAWN_Z = 0.90
PLATE_SPAWN_Z = 0.90


def grid_xy() -> np.ndarray:
    """The 6x6 grid of (x, y) positions, float ``[36, 2]``, row-major, around the center."""
    unit = np.linspace(-1.0, 1.0, GRID_SIDE)
    gx, gy = np.meshgrid(unit, unit, indexing="ij")
    return np.stack([gx.ravel(), gy.ravel()], axis=1) * GRID_HALF_EDGE_M + GRID_CENTER_XY


def position_pairs() -> np.ndarray:
    """Ordered (object, plate) grid positions more than 7 cm apart, float ``[784, 2, 2]``."""
    xy = grid_xy()
    pairs = [(a, b) for i, a in enumerate(xy) for j, b in enumerate(xy)
             if i != j and np.linalg.norm(b - a) > MIN_PAIR_DISTANCE_M]
    return np.asarray(pairs)


def far_cells(pairs: np.ndarray, from_object_m: float = 0.0, from_plate_m: float = 0.0) -> np.ndarray:
    """Per (object, plate) pair, the grid cell farthest from both of them among those more than
    ``from_object_m`` from the object and at least ``from_plate_m`` from the plate, or -1 where no cell
    is: where a distractor or a moved object goes. ``pairs``: float ``[b, 2, 2]``; returns int ``[b]``."""
    grid = grid_xy()
    d_object = np.linalg.norm(grid[None] - pairs[:, None, 0], axis=-1)  # [b, 36]
    d_plate = np.linalg.norm(grid[None] - pairs[:, None, 1], axis=-1)
    allowed = (d_object > from_object_m) & (d_plate >= from_plate_m - 1e-9)
    score = np.where(allowed, np.minimum(d_object, d_plate), -np.inf)
    return np.where(allowed.any(axis=1), score.argmax(axis=1), -1)


def pairs_with_far_cell(from_object_m: float, from_plate_m: float) -> tuple[int, ...]:
    """Indices into ``position_pairs()`` of the pairs that have a ``far_cells`` cell."""
    return tuple(int(k) for k in np.flatnonzero(far_cells(position_pairs(), from_object_m, from_plate_m) >= 0))


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
    """Which objects, plates and table overlays (index ranges), position pairs and yaws
    (indices into ``position_pairs()`` and ``YAWS_RAD``; ``None``: all) a split draws from.

    ``parity`` (0 or 1) keeps only the combinations whose five digits sum to an even (0) or odd
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

    @property
    def position_ids(self) -> np.ndarray:
        return np.arange(len(position_pairs())) if self.positions is None else np.asarray(self.positions)

    @property
    def yaw_ids(self) -> np.ndarray:
        return np.arange(len(YAWS_RAD)) if self.yaws is None else np.asarray(self.yaws)

    @property
    def radices(self) -> tuple[int, int, int, int, int]:
        """Of the whole product (before ``parity``)."""
        return (len(self.objects), len(self.plates), len(self.overlays),
                len(self.position_ids), len(self.yaw_ids))

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
    """A decoded initial state: global object/plate/overlay indices, the pair, the yaw."""

    object: int
    plate: int
    overlay: int
    position_pair: int
    yaw: int


def decode(episode_ids: np.ndarray, split: Split) -> dict[str, np.ndarray]:
    """Episode ids int ``[B]`` -> dict of int ``[B]`` arrays: object, plate, overlay (global
    indices into the pack), position_pair (into ``position_pairs()``), yaw (into ``YAWS_RAD``)."""
    ids = np.asarray(episode_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= split.num_episodes):
        bad = ids[(ids < 0) | (ids >= split.num_episodes)][:5].tolist()
        raise ValueError(f"episode ids {bad} out of range for split {split.name!r} "
                         f"(0..{split.num_episodes - 1})")
    if split.product_ids is not None:
        ids = split.product_ids[ids]
    n_obj, n_plate, n_over, n_pair, n_yaw = split.radices
    return {
        "yaw": split.yaw_ids[ids % n_yaw],
        "position_pair": split.position_ids[(ids // n_yaw) % n_pair],
        "overlay": (ids // (n_yaw * n_pair)) % n_over + split.overlays.start,
        "plate": (ids // (n_yaw * n_pair * n_over)) % n_plate + split.plates.start,
        "object": ids // (n_yaw * n_pair * n_over * n_plate) + split.objects.start,
    }


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

    digits = (episode.object - split.objects.start, episode.plate - split.plates.start,
              episode.overlay - split.overlays.start, digit(split.position_ids, episode.position_pair, "position_pair"),
              digit(split.yaw_ids, episode.yaw, "yaw"))
    for d, r, name in zip(digits[:3], split.radices, ("object", "plate", "overlay")):
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
