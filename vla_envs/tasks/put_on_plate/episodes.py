"""Initial states of PutOnPlateInScene25 as data: splits, the position grid, yaws, and the
mixed-radix ``episode_id`` that indexes them.

An ``episode_id`` of a split decodes, most significant digit first, into
``(object, plate, overlay, position pair, yaw)`` with radices
``(n_objects, n_plates, n_overlays, n_position_pairs, n_yaws)``; digits are offsets into the
split's ranges. Train: 16 objects x 1 plate x 16 overlays x 784 pairs x 4 yaws = 802,816 ids.
Pure numpy; shared by the simulator, the tests and the eval tools.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Split:
    """Which objects, plates and table overlays a split draws from (index ranges)."""

    name: str
    objects: range
    plates: range
    overlays: range

    @property
    def radices(self) -> tuple[int, int, int, int, int]:
        return (len(self.objects), len(self.plates), len(self.overlays),
                len(position_pairs()), len(YAWS_RAD))

    @property
    def num_episodes(self) -> int:
        return int(np.prod(self.radices))


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
    indices into the pack), position_pair, yaw."""
    ids = np.asarray(episode_ids, dtype=np.int64)
    if ids.size and (ids.min() < 0 or ids.max() >= split.num_episodes):
        bad = ids[(ids < 0) | (ids >= split.num_episodes)][:5].tolist()
        raise ValueError(f"episode ids {bad} out of range for split {split.name!r} "
                         f"(0..{split.num_episodes - 1})")
    n_obj, n_plate, n_over, n_pair, n_yaw = split.radices
    return {
        "yaw": ids % n_yaw,
        "position_pair": (ids // n_yaw) % n_pair,
        "overlay": (ids // (n_yaw * n_pair)) % n_over + split.overlays.start,
        "plate": (ids // (n_yaw * n_pair * n_over)) % n_plate + split.plates.start,
        "object": ids // (n_yaw * n_pair * n_over * n_plate) + split.objects.start,
    }


def encode(episode: Episode, split: Split) -> int:
    """The episode id of ``episode`` (global indices) within ``split``."""
    n_obj, n_plate, n_over, n_pair, n_yaw = split.radices
    digits = (episode.object - split.objects.start, episode.plate - split.plates.start,
              episode.overlay - split.overlays.start, episode.position_pair, episode.yaw)
    for d, r, name in zip(digits, split.radices, ("object", "plate", "overlay", "position_pair", "yaw")):
        if not 0 <= d < r:
            raise ValueError(f"{name} {d} outside split {split.name!r}")
    eid = 0
    for d, r in zip(digits, split.radices):
        eid = eid * r + d
    return int(eid)
