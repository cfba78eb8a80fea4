"""The arm interface: what a 7-DoF arm with a parallel gripper offers the rest of the stack.

Frames: every pose is the TCP (between the fingertips, the twin's ``panda_hand_tcp`` and libfranka's
default end-effector frame of the Franka Hand) in the robot base frame. A Cartesian command is an
absolute TCP pose: the ``SafetyLayer`` turns each relative step of the policy (ManiSkill's
``pd_ee_delta_pose`` convention, applied to the measured pose) into a target pose it has checked, so
what the arm is sent never depends on where the arm's own motion generator believes it is.

Motion commands (``move_to_pose``, ``set_gripper``, ``move_to_joint_positions``) only run when they
carry the permit of the ``SafetyLayer`` attached to the arm: code that holds a bare ``Arm`` can read
it and stop it, never move it. ``stop`` and ``recover`` need no permit. A motion is started under a
lock ``stop`` also takes, with the caller's last check for a stop inside it: a stop either comes
before that check (nothing is sent) or after the motion has started (the stop ends it), never in
between. An arm once given to a
dry-run layer sends no stop either (a ROS arm's stop publishes a target), also after that layer
closed, until a layer that moves it is attached.
"""

from __future__ import annotations

import abc
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

from real_robot.errors import SafetyBypassError
from real_robot.lifecycle import requires_connection

if TYPE_CHECKING:
    import numpy as np

NUM_JOINTS = 7


@dataclass(frozen=True)
class ArmObservation:
    """One reading of the arm's state."""

    joint_positions_rad: "np.ndarray"
    """Joint angles ``[7]``."""
    gripper_width_m: float
    """Distance between the fingers."""
    T_base_from_tcp: "np.ndarray"
    """TCP pose in the robot base frame, homogeneous ``[4, 4]``."""
    timestamp_s: float
    """``time.monotonic()`` when the state was read."""

    @property
    def tcp_position_m(self) -> "np.ndarray":
        """TCP position ``[3]`` in the base frame."""
        return self.T_base_from_tcp[:3, 3].copy()

    @property
    def tcp_quaternion_wxyz(self) -> "np.ndarray":
        """TCP orientation in the base frame as a unit quaternion ``(w, x, y, z)``, ``w >= 0``."""
        from real_robot.transforms import matrix_to_quaternion_wxyz

        return matrix_to_quaternion_wxyz(self.T_base_from_tcp[:3, :3])

    def as_dict(self) -> dict[str, Any]:
        """Flat values keyed like ``Arm.observation_features``."""
        return {
            "joint_positions_rad": self.joint_positions_rad.copy(),
            "gripper_width_m": float(self.gripper_width_m),
            "tcp_position_m": self.tcp_position_m,
            "tcp_quaternion_wxyz": self.tcp_quaternion_wxyz,
        }


class Arm(abc.ABC):
    """A 7-DoF arm with a parallel gripper, used through a ``SafetyLayer``.

    Subclasses implement the underscored hooks; the public motion methods check the connection and
    the safety permit first. Use as a context manager to connect and always disconnect.
    """

    def __init__(self) -> None:
        self._safety_permit: object | None = None
        self._dry_run = False
        self._gripper_kept: bool | None = None  # a gripper command waiting for the running one to end
        self._motion_gate = threading.Lock()  # held while a motion starts, and by stop()

    # ----- features: known without hardware ------------------------------------------------
    @property
    def observation_features(self) -> dict[str, Any]:
        """Keys of ``ArmObservation.as_dict()``: a shape tuple for arrays, ``float`` for scalars."""
        return {
            "joint_positions_rad": (NUM_JOINTS,),
            "gripper_width_m": float,
            "tcp_position_m": (3,),
            "tcp_quaternion_wxyz": (4,),
        }

    @property
    def action_features(self) -> dict[str, Any]:
        """One step: base-frame translation, base-aligned rotation about the TCP, gripper state."""
        return {"translation_m": (3,), "rotation_rotvec_rad": (3,), "gripper_close": bool}

    @property
    @abc.abstractmethod
    def relative_dynamics_factor(self) -> float:
        """The fraction of the arm's maximum velocity, acceleration and jerk it moves with, in (0, 1]."""

    # ----- lifecycle ----------------------------------------------------------------------
    @property
    @abc.abstractmethod
    def is_connected(self) -> bool:
        """Whether ``connect()`` succeeded and ``disconnect()`` was not called since."""

    @abc.abstractmethod
    def connect(self, timeout_s: float | None = None) -> None:
        """Connect to the arm (and its gripper).

        Args:
            timeout_s: give up after this long; None: the config's default.

        Raises:
            DeviceAlreadyConnectedError: already connected.
            RobotUnreachableError: no answer within the deadline, or the connection was refused.
        """

    @abc.abstractmethod
    def disconnect(self) -> None:
        """Stop any motion and close the connection. Safe to call when not connected."""

    def __enter__(self) -> "Arm":
        self.connect()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.disconnect()

    # ----- reading --------------------------------------------------------------------------
    @abc.abstractmethod
    def observation(self) -> ArmObservation:
        """The current joint positions, gripper width and TCP pose.

        Raises:
            DeviceNotConnectedError: not connected.
        """

    # ----- stopping: always allowed -------------------------------------------------------
    def stop(self) -> None:
        """Stop the running motion now (the arm holds its pose). A no-op when idle or disconnected, and
        for an arm last given to a dry-run ``SafetyLayer`` (it is read, never commanded)."""
        if self._dry_run:
            return
        with self._motion_gate:  # a motion that is starting has started when this stop ends it
            self._stop()

    @abc.abstractmethod
    def _stop(self) -> None:
        """The backend's stop (see ``stop``); ``disconnect`` stops through ``stop``."""

    @abc.abstractmethod
    def recover(self) -> bool:
        """Clear a reflex / error state so the arm accepts motions again.

        Returns:
            Whether the arm reports itself ready.
        """

    # ----- motion: only through the SafetyLayer --------------------------------------------
    def _attach_safety(self, permit: object, dry_run: bool = False) -> None:
        """Called by ``SafetyLayer``: from now on motion commands must carry ``permit``; with
        ``dry_run`` nothing is sent to the arm, stops included, until a moving layer is attached."""
        if self._safety_permit is not None:
            raise SafetyBypassError(f"{self} already has a SafetyLayer; one arm takes one safety layer")
        self._safety_permit = permit
        self._dry_run = bool(dry_run)

    def _detach_safety(self, permit: object) -> None:
        if self._safety_permit is permit:
            self._safety_permit = None

    def _check_permit(self, permit: object | None, command: str) -> None:
        if permit is None or permit is not self._safety_permit:
            raise SafetyBypassError(f"{type(self).__name__}.{command} was called without the permit of its "
                                    f"SafetyLayer; move the arm through SafetyLayer(arm, limits).send_action()")

    @requires_connection
    def move_to_pose(self, T_base_from_tcp: Any, *, permit: object | None = None,
                     preempted: Callable[[], bool] | None = None) -> bool:
        """Move the TCP to an absolute pose (a straight Cartesian motion).

        Args:
            T_base_from_tcp: ``[4, 4]`` the target TCP pose in the base frame.
            permit: the attached ``SafetyLayer``'s permit.
            preempted: asked right before the motion starts, where no ``stop()`` can come in between:
                True (a stop since the caller decided) sends nothing.

        Returns:
            Whether the motion was started.

        Raises:
            SafetyBypassError: no or a foreign permit.
            MotionError: the robot aborted the motion.
        """
        self._check_permit(permit, "move_to_pose")
        return self._gated(lambda: self._start_move_to_pose(T_base_from_tcp), preempted)

    def _gated(self, start: Callable[[], None], preempted: Callable[[], bool] | None) -> bool:
        with self._motion_gate:
            if preempted is not None and preempted():
                return False
            start()
        self._finish_motion()  # waiting, if the backend waits, outside the gate: a stop can end it
        return True

    @requires_connection
    def set_gripper(self, close: bool, *, permit: object | None = None, wait_for_running: bool = False) -> bool:
        """Close (grasp whatever is between the fingers) or open the gripper fully.

        A Franka gripper runs one command at a time. While it still runs the previous one (an arm
        whose commands return before the fingers are done: ``wait_for_motion=False``), the command is
        kept and sent by the first ``set_gripper`` or ``update_gripper`` after that one ended (the
        latest kept command wins; ``disconnect`` drops it), so that the arm's steps never wait for the
        fingers: in the twin a step takes 200 ms whatever the gripper does.

        Args:
            close: True closes, False opens.
            permit: the attached ``SafetyLayer``'s permit.
            wait_for_running: wait for the running command to end and send this one now (an
                episode's first open).

        Returns:
            Whether the command was sent now (else it is kept).

        Raises:
            SafetyBypassError: no or a foreign permit.
        """
        self._check_permit(permit, "set_gripper")
        self._gripper_kept = bool(close)
        if wait_for_running:
            self._wait_gripper()
        return self._send_kept_gripper()

    @requires_connection
    def update_gripper(self, *, permit: object | None = None) -> bool:
        """Send the gripper command ``set_gripper`` kept, if any, once the gripper has ended the running
        one; never waits. A ``SafetyLayer`` calls it at every step.

        Returns:
            Whether a command was sent.

        Raises:
            SafetyBypassError: no or a foreign permit.
        """
        self._check_permit(permit, "update_gripper")
        return self._send_kept_gripper()

    @property
    def gripper_command_kept(self) -> bool:
        """Whether a gripper command ``set_gripper`` kept still waits for the running one to end."""
        return self._gripper_kept is not None

    def _send_kept_gripper(self) -> bool:
        if self._gripper_kept is None or self._gripper_busy():
            return False
        close, self._gripper_kept = self._gripper_kept, None
        self._wait_gripper()  # the last command has ended: collect its answer
        self._set_gripper(close)
        return True

    @requires_connection
    def move_to_joint_positions(self, joint_positions_rad: Any, *, permit: object | None = None,
                                preempted: Callable[[], bool] | None = None) -> bool:
        """Move in joint space to ``joint_positions_rad`` ``[7]`` (homing) and wait until there.

        Args:
            preempted: as ``move_to_pose``'s.

        Returns:
            Whether the motion was started.

        Raises:
            SafetyBypassError: no or a foreign permit.
            MotionError: the robot aborted the motion.
        """
        self._check_permit(permit, "move_to_joint_positions")
        return self._gated(lambda: self._start_move_to_joint_positions(joint_positions_rad), preempted)

    @abc.abstractmethod
    def _start_move_to_pose(self, T_base_from_tcp: Any) -> None:
        """Start the backend's Cartesian motion (see ``move_to_pose``); return once a ``_stop`` would
        end it. ``_finish_motion`` then waits for it where the backend's config says so."""

    @abc.abstractmethod
    def _finish_motion(self) -> None:
        """Wait for the motion just started, where it is waited for (always for a joint move);
        raises ``MotionError`` when the robot aborted it."""

    @abc.abstractmethod
    def _set_gripper(self, close: bool) -> None:
        """The backend's gripper command (see ``set_gripper``), sent when no other one runs and the
        last one's answer was collected (``_wait_gripper``)."""

    def _gripper_busy(self) -> bool:
        """Whether the gripper still runs a command, asked without waiting (a backend whose
        ``_set_gripper`` returns once the gripper is done keeps this default)."""
        return False

    def _wait_gripper(self) -> None:
        """Wait for the running gripper command to end (see ``_gripper_busy``)."""

    @abc.abstractmethod
    def _start_move_to_joint_positions(self, joint_positions_rad: Any) -> None:
        """Start the backend's joint move (see ``move_to_joint_positions``, ``_start_move_to_pose``)."""


def now_s() -> float:
    """The clock every ``timestamp_s`` in real_robot uses (monotonic)."""
    return time.monotonic()
