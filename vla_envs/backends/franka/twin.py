"""What "the same observation and action as the Panda twin" means on the real Franka, as data
and pure functions (numpy and torch; no robot SDK), so every user of the real arm (the env
backend, the ROS 2 policy node, tests) builds the policy's input the same way.

The twin (``PutOnPlateInScene25*``, ``vla_envs/tasks/put_on_plate/env.py``):

* places the Panda's base at ``PANDA_BASE`` in its world: ``(0.30, 0, 0.87)`` m, turned 180 deg
  about z (it faces -x). Its ``state`` is ``[9 qpos (7 joints, 2 fingers), TCP xyz, TCP wxyz]``
  with the TCP pose in *that world* frame. A real base-frame pose is mapped through
  ``T_WORLD_FROM_BASE`` to get the same numbers.
* renders its camera from a camera file (intrinsics, ``T_base_from_cam``) at the file's
  resolution, cropped to ``camera_crop`` and resized to ``image_size``; the real frame is cropped
  and resized the same way, by the same function.
* executes an action with ManiSkill's ``pd_ee_delta_pose`` at 5 Hz (``real_robot.twin_action``
  says how the numbers become a Cartesian target). Its PD control reaches only part of each
  target within one 0.2 s step; the real arm reaches its target. ``TWIN_TRACKING_GAIN`` scales
  the real step so that the real arm moves as far as the twin does (measured by
  ``bench/twin_tracking.py``; ``tests/robot/test_franka_parity.py`` checks the result step by step
  against the twin).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

TWIN_BASE_POSITION_M = (0.30, 0.0, 0.87)
"""The twin's ``PANDA_BASE.p`` (its table top is at z = 0.87)."""
T_WORLD_FROM_BASE = np.array([[-1.0, 0.0, 0.0, TWIN_BASE_POSITION_M[0]],
                              [0.0, -1.0, 0.0, TWIN_BASE_POSITION_M[1]],
                              [0.0, 0.0, 1.0, TWIN_BASE_POSITION_M[2]],
                              [0.0, 0.0, 0.0, 1.0]])
"""The twin's robot base in its world: ``PANDA_BASE`` (quaternion wxyz (0, 0, 0, 1), 180 deg about z)."""
STATE_DIM = 16
"""7 joint positions, 2 finger positions, TCP xyz (world), TCP quaternion wxyz (world)."""
CONTROL_PERIOD_S = 0.2
"""The twin's control rate is 5 Hz."""
TWIN_TRACKING_GAIN = (0.86, 0.92, 0.915, 0.862)
"""Fraction of a ``pd_ee_delta_pose`` target the twin's Panda reaches in one 0.2 s step, along the
base frame's x, y, z and for the rotation (measured over +-0.7 actions from the rest pose by
``bench/twin_tracking.py``; it varies by about 0.02 with the pose)."""
TWIN_REST_JOINT_POSITIONS_RAD = (0.0, 0.3927, 0.0, -1.9635, 0.0, 2.3562, 0.7854)
"""The Panda keyframe every twin episode starts from (ManiSkill's ``rest``, no joint noise in
``Main``): the real arm is homed here so that episodes start where the policy learned to."""
TWIN_REST_QUATERNION_WXYZ = (0.0, 0.0, 1.0, 0.0)
"""The twin's TCP orientation at rest, in its world. A quaternion and its negative are the same
rotation; the twin's physics keeps the sign continuous (``y`` near +1, ``w`` of either sign), so
the real one is given the sign on this side, never ``w >= 0``, which would flip ``y`` to -1."""


def twin_state(joint_positions_rad: np.ndarray, gripper_width_m: float, T_base_from_tcp: np.ndarray) -> np.ndarray:
    """The twin's ``state`` float32 ``[16]`` from a real arm reading.

    Args:
        joint_positions_rad: the 7 arm joints.
        gripper_width_m: distance between the fingers; each finger joint of the twin is half of it.
        T_base_from_tcp: the TCP pose in the robot base frame ``[4, 4]``.
    """
    from real_robot.transforms import matrix_to_quaternion_wxyz

    joints = np.asarray(joint_positions_rad, np.float64).reshape(7)
    T_world_from_tcp = T_WORLD_FROM_BASE @ np.asarray(T_base_from_tcp, np.float64).reshape(4, 4)
    finger = float(gripper_width_m) / 2.0
    quat = matrix_to_quaternion_wxyz(T_world_from_tcp[:3, :3])
    if float(np.dot(quat, TWIN_REST_QUATERNION_WXYZ)) < 0.0:
        quat = -quat
    parts = [joints, [finger, finger], T_world_from_tcp[:3, 3], quat]
    return np.concatenate(parts).astype(np.float32)


def twin_image(frame_rgb: np.ndarray, image_size: int | tuple[int, int],
               camera_crop: tuple[int, int, int, int] | None = None,
               camera_hw: tuple[int, int] | None = None,
               undistort: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
    """The policy's image from a real color frame: undistorted when the camera file records lens
    distortion (the twin renders a pinhole camera), the twin's ``camera_crop`` (pixels of the
    camera file's resolution), resized to ``image_size`` by ``vla_envs.core.images.resize_rgb``,
    as the twin resizes its own rendering of that region (its default ``native_render``).

    Args:
        frame_rgb: uint8 ``[H, W, 3]``, RGB.
        image_size: side (or ``(height, width)``) of the image the policy reads.
        camera_crop: ``(left, top, right, bottom)`` in pixels of ``camera_hw``; None: the whole frame.
        camera_hw: the camera file's ``(height, width)``; the frame must have that size (the crop
            and the intrinsics refer to it). None: the frame's own size.
        undistort: the camera file's ``undistorter()`` (None: the frame is a pinhole camera's).

    Raises:
        ValueError: the frame is not uint8 RGB, its size is not the camera file's, or the crop
            does not fit it.
    """
    from vla_envs.core.images import resize_rgb

    frame = np.asarray(frame_rgb)
    if frame.dtype != np.uint8 or frame.ndim != 3 or frame.shape[2] != 3:
        raise ValueError(f"a camera frame is uint8 [H, W, 3] RGB, got {frame.dtype} {frame.shape}")
    h, w = frame.shape[:2]
    if camera_hw is not None and (h, w) != tuple(camera_hw):
        raise ValueError(f"the camera frame is {w}x{h} but the camera file describes {camera_hw[1]}x{camera_hw[0]}: "
                         "stream the resolution the camera was calibrated at")
    if undistort is not None:
        frame = undistort(frame)
    left, top, right, bottom = (0, 0, w, h) if camera_crop is None else (int(v) for v in camera_crop)
    if not (0 <= left < right <= w and 0 <= top < bottom <= h):
        raise ValueError(f"camera_crop {camera_crop} must satisfy 0 <= left < right <= {w} and 0 <= top < bottom <= {h}")
    out_h, out_w = (image_size, image_size) if isinstance(image_size, (int, np.integer)) else image_size
    return np.ascontiguousarray(resize_rgb(frame[top:bottom, left:right], (int(out_h), int(out_w))))


def twin_scaled_action(action: np.ndarray) -> np.ndarray:
    """The action whose full execution moves the real TCP as far as ``action`` moves the twin's in
    one step: the twin's clipping (translation per component, rotation by norm), then
    ``TWIN_TRACKING_GAIN`` per base axis and on the rotation. The gripper is left as is, and so is
    an action with a NaN or infinite value (the safety layer refuses it).

    Shapes:
        action: ``[7]``. Returns float32 ``[7]``.
    """
    a = np.asarray(action, np.float64).reshape(7).copy()
    if not np.isfinite(a).all():
        # left as it is: clipping would make an infinite translation a full step, which the safety
        # layer must refuse (it stops the arm) instead of sending
        return a.astype(np.float32)
    a[:3] = np.clip(a[:3], -1.0, 1.0) * TWIN_TRACKING_GAIN[:3]
    norm = float(np.linalg.norm(a[3:6]))
    if norm > 1.0:
        a[3:6] /= norm
    a[3:6] *= TWIN_TRACKING_GAIN[3]
    return a.astype(np.float32)


def twin_action_from_scaled(scaled: np.ndarray) -> np.ndarray:
    """The twin action of a scaled one (``twin_scaled_action``'s inverse on the twin's range): what
    a real step that was sent means in the twin's convention, e.g. to record real episodes as demos.

    Shapes:
        scaled: ``[7]``. Returns float32 ``[7]``.
    """
    a = np.asarray(scaled, np.float64).reshape(7).copy()
    a[:3] /= TWIN_TRACKING_GAIN[:3]
    a[3:6] /= TWIN_TRACKING_GAIN[3]
    return a.astype(np.float32)
