"""The one observation dict and action convention shared by sim and real.

Observation (single env; the vector env batches every array on a leading ``N`` axis and
the instruction into a tuple of ``N`` strings):

========================  ===========================  ==========================================
key                       space                        meaning
========================  ===========================  ==========================================
``"image"``               uint8 ``[H, W, 3]``          main (third-person) camera, RGB
``"wrist_image"``         uint8 ``[H, W, 3]``          wrist camera, RGB (only if the env has one)
``"state"``               float32 ``[S]``              proprioception (backend documents layout)
``"instruction"``         ``Text``                     the language instruction of the episode
========================  ===========================  ==========================================

Action: float ``[7]`` in ``[-1, 1]``: delta end-effector translation xyz (3), delta rotation
(3), gripper (1; ``-1`` open, ``+1`` close). Each backend scales the normalised deltas to metres /
radians and documents its scale and rotation convention: ManiSkill's Panda (``pd_ee_delta_pose``)
reads the rotation as XYZ Euler angles times -0.1 rad (``real_robot.twin_action``), LIBERO as an
axis-angle vector; the real Franka does exactly what the ManiSkill twin does.
"""

from __future__ import annotations

import string

import numpy as np
from gymnasium import spaces

ACTION_DIM = 7
MAX_INSTRUCTION_CHARS = 512
_INSTRUCTION_CHARSET = frozenset(string.printable)


def make_action_space() -> spaces.Box:
    """The 7-D normalised delta-EEF + gripper action space of one env."""
    return spaces.Box(-1.0, 1.0, shape=(ACTION_DIM,), dtype=np.float32)


def make_observation_space(
    image_hw: tuple[int, int], state_dim: int, wrist_image_hw: tuple[int, int] | None = None
) -> spaces.Dict:
    """The observation space of one env.

    Args:
        image_hw: (height, width) of the main camera.
        state_dim: length of the proprio vector.
        wrist_image_hw: (height, width) of the wrist camera, or None if there is none.
    """
    h, w = image_hw
    fields: dict[str, spaces.Space] = {"image": spaces.Box(0, 255, (h, w, 3), np.uint8)}
    if wrist_image_hw is not None:
        wh, ww = wrist_image_hw
        fields["wrist_image"] = spaces.Box(0, 255, (wh, ww, 3), np.uint8)
    fields["state"] = spaces.Box(-np.inf, np.inf, (state_dim,), np.float32)
    fields["instruction"] = spaces.Text(
        max_length=MAX_INSTRUCTION_CHARS, min_length=1, charset=_INSTRUCTION_CHARSET
    )
    return spaces.Dict(fields)


def array_keys(observation_space: spaces.Dict) -> list[str]:
    """Keys of the fixed-shape array fields (everything but the instruction)."""
    return [k for k, s in observation_space.spaces.items() if isinstance(s, spaces.Box)]
