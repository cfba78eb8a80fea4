"""The twin's action convention, reproduced for the real arm.

A policy trained in the ManiSkill twin emits a normalised action ``[7]``: translation xyz (3), rotation
(3), gripper (1; -1 open, +1 close). The twin runs Panda's ``pd_ee_delta_pose`` controller
(mani-skill 3.0.1, ``mani_skill/agents/controllers/pd_ee_pose.py``), which

- clips the translation per component to [-1, 1] and scales it to +/-0.1 m, in the robot base frame;
- clips the rotation by its norm (a norm above 1 is scaled to 1), then multiplies it by the config's
  ``rot_lower``, which is **-0.1**: a positive action rotates the negative way;
- reads those three numbers as intrinsic XYZ Euler angles (``euler_angles_to_matrix(.., "XYZ")``),
  and applies the rotation on the left (``q_new = q_delta * q_old``): about the TCP, axes aligned with
  the base frame (``frame="root_translation:root_aligned_body_rotation"``);
- targets the delta from the *measured* TCP pose (``use_target=False``).

``tests/robot/test_twin_action.py`` checks this module against the controller itself. The twin's
PD tracking reaches only part of each target within one 20 Hz step (about 40 % at full scale on
PickCube): the same action moves the real arm, which reaches its target, further per step.
"""

from __future__ import annotations

from typing import Any

ACTION_DIM = 7
TRANSLATION_M_PER_UNIT = 0.1
"""Panda ``pd_ee_delta_pose``: ``pos_lower=-0.1, pos_upper=0.1``."""
ROTATION_RAD_PER_UNIT = -0.1
"""Panda ``pd_ee_delta_pose``: the rotation is multiplied by ``rot_lower=-0.1`` (sign included)."""


def action_to_step(action: Any) -> tuple[Any, Any, bool, bool]:
    """A normalised twin action -> the Cartesian step the twin's controller would target.

    Args:
        action: ``[7]`` finite floats; values outside [-1, 1] are clipped as the twin clips them.

    Returns:
        ``(translation_m [3] base frame, R_delta [3, 3] base-aligned about the TCP, gripper_close,
        clipped)``; ``clipped`` is True when the action was outside the twin's range.
    """
    import numpy as np

    from real_robot.transforms import euler_xyz_to_matrix

    action = np.asarray(action, dtype=np.float64).reshape(ACTION_DIM)
    translation = np.clip(action[:3], -1.0, 1.0)
    rotation = action[3:6].copy()
    norm = float(np.linalg.norm(rotation))
    if norm > 1.0:
        rotation /= norm
    clipped = bool(np.any(translation != action[:3]) or norm > 1.0 or abs(action[6]) > 1.0)
    translation_m = translation * TRANSLATION_M_PER_UNIT
    R_delta = euler_xyz_to_matrix(rotation * ROTATION_RAD_PER_UNIT)
    return translation_m, R_delta, bool(action[6] > 0.0), clipped


def step_to_action(translation_m: Any, R_delta: Any, gripper_close: bool) -> Any:
    """The inverse of ``action_to_step`` for a step inside the twin's range: the normalised action
    ``[7]`` (float32) whose step is the one given (gripper as -1 / +1)."""
    import numpy as np

    from real_robot.transforms import matrix_to_euler_xyz

    action = np.empty(ACTION_DIM, dtype=np.float64)
    action[:3] = np.asarray(translation_m, dtype=np.float64).reshape(3) / TRANSLATION_M_PER_UNIT
    action[3:6] = matrix_to_euler_xyz(R_delta) / ROTATION_RAD_PER_UNIT
    action[6] = 1.0 if gripper_close else -1.0
    return action.astype(np.float32)
