"""Success and dense reward of PutOnPlateInScene25 as pure batched tensor functions.

No simulator here: the env gathers poses, bounding boxes, contact forces and grasp flags and
calls these, so they can be tested on constructed states.
"""

from __future__ import annotations

import torch

XY_MARGIN_M = 0.01
Z_GAP_MAX_M = 0.05
MIN_CONTACT_FORCE_N = 0.03
CONSECUTIVE_GRASP_STEPS = 5
REWARD_GRASPED, REWARD_CONSECUTIVE, REWARD_SUCCESS = 0.1, 0.1, 1.0
MAX_STAGED_SCORE = REWARD_GRASPED + REWARD_CONSECUTIVE + REWARD_SUCCESS
CLOSENESS_SCALE_PER_M = 5.0


def on_plate_radius(plate_bbox: torch.Tensor) -> torch.Tensor:
    """How far from the plate's centre in xy an object's centre may be and still count as on
    it, float ``[B]`` (metres): the plate's largest half-extent + 1 cm."""
    return plate_bbox.max(dim=1).values / 2 + XY_MARGIN_M


def object_on_plate(obj_pos: torch.Tensor, plate_pos: torch.Tensor, obj_bbox: torch.Tensor,
                    plate_bbox: torch.Tensor, contact_force: torch.Tensor) -> torch.Tensor:
    """Success flags, bool ``[B]``.

    Args:
        obj_pos, plate_pos: centres, ``[B, 3]`` (world, metres).
        obj_bbox, plate_bbox: axis-aligned world bounding-box sizes after settling, ``[B, 3]``.
        contact_force: norm of the object-plate contact force, ``[B]`` (newtons).

    Success: the object's centre is within the plate's largest half-extent + 1 cm in xy, above
    the plate with a vertical gap (centre distance minus both half-heights) of at most 5 cm,
    and touching it with more than 0.03 N.
    """
    offset = obj_pos - plate_pos
    plate_half, obj_half = plate_bbox / 2, obj_bbox / 2
    xy_ok = torch.linalg.norm(offset[:, :2], dim=1) <= on_plate_radius(plate_bbox)
    z_ok = (offset[:, 2] > 0) & (offset[:, 2] - plate_half[:, 2] - obj_half[:, 2] <= Z_GAP_MAX_M)
    return xy_ok & z_ok & (contact_force > MIN_CONTACT_FORCE_N)


def update_grasp_streak(streak: torch.Tensor, grasped: torch.Tensor) -> torch.Tensor:
    """Consecutive grasped steps, int ``[B]``: +1 while grasped, 0 otherwise."""
    return torch.where(grasped, streak + 1, torch.zeros_like(streak))


def staged_score(ever_grasped: torch.Tensor, ever_consecutive: torch.Tensor,
                 success: torch.Tensor) -> torch.Tensor:
    """The potential the dense reward differences, float ``[B]``:
    0.1 once grasped + 0.1 once grasped for 5 consecutive steps + 1.0 while successful
    (only after a grasp: pushing the object onto the plate earns nothing)."""
    return (REWARD_GRASPED * ever_grasped.float() + REWARD_CONSECUTIVE * ever_consecutive.float()
            + REWARD_SUCCESS * (success & ever_grasped).float())


def closeness(distance_m: torch.Tensor) -> torch.Tensor:
    """1 at distance 0, falling towards 0 (0.75 at 5 cm, 0.24 at 25 cm), same shape as the input."""
    return 1 - torch.tanh(CLOSENESS_SCALE_PER_M * distance_m)


def shaping_potential(tcp_to_object_m: torch.Tensor, object_to_plate_xy_m: torch.Tensor,
                      ever_grasped: torch.Tensor, weight: float) -> torch.Tensor:
    """Reach-and-place shaping added to ``staged_score``, float ``[B]``:
    ``weight * (reach + place)``, reach = closeness of the TCP to the object until the first
    grasp and 1 after it, place = closeness of the object to the plate in xy once grasped.

    Differenced like the staged score, it pays for every step that brings the gripper nearer
    the object (then the object nearer the plate) and takes it back for every step away, so
    an episode's shaping return is only the final potential minus the first: it cannot be
    farmed by moving back and forth. Shapes: distances and flags ``[B]``.
    """
    reach = torch.where(ever_grasped, torch.ones_like(tcp_to_object_m), closeness(tcp_to_object_m))
    place = ever_grasped.float() * closeness(object_to_plate_xy_m)
    return weight * (reach + place)


def dense_reward(score: torch.Tensor, previous_score: torch.Tensor) -> torch.Tensor:
    """Reward of a step, float ``[B]``: the change of ``staged_score``, so an episode's return
    telescopes to its final score."""
    return score - previous_score


def sparse_reward(success: torch.Tensor, ever_grasped: torch.Tensor) -> torch.Tensor:
    """Reward of a step in ``reward_mode="sparse"``, float ``[B]``: 1 while successful after a
    grasp (like the staged score's success term), else 0; nothing for the grasp itself. With
    terminations on, an episode's return is 1 if it succeeded after a grasp and 0 otherwise (an
    object pushed onto the plate succeeds, and ends the episode, with return 0)."""
    return (success & ever_grasped).float()
