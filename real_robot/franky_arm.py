"""A Franka (FR3 or Panda) through franky (``pip install "vla-rl[robot]"``, package franky-control).

libfranka's end-effector frame with the Franka Hand's default ``F_T_EE`` (0.1034 m along the flange z,
-45 degrees about it) is the TCP between the fingertips, the same frame as the twin's
``panda_hand_tcp``. The observed pose is the forward kinematics of the *measured* joints (franky's
``model.pose(Frame.EndEffector, state)``): on the robot that equals libfranka's ``O_T_EE``, while
franky-sim reports the *desired* pose there. ``move_to_pose`` sends an absolute ``CartesianMotion``:
franky's relative motions start from its *desired* pose, which runs ahead of the measured one while a
motion is replaced mid-way (by up to centimetres on franky-sim), so a relative step checked against
the measured pose could end outside the workspace box.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

from real_robot.arm import NUM_JOINTS, Arm, ArmObservation, now_s
from real_robot.errors import MotionError, RealRobotError, RealtimeKernelError, RobotUnreachableError, require_module
from real_robot.lifecycle import requires_connection, requires_no_connection

SETTLED_JOINT_SPEED_RAD_PER_S = 0.005
"""Below this on every joint the arm counts as at rest."""
MIN_STEP_M = 1e-5
MIN_STEP_RAD = 1e-5
"""Steps smaller than these in both translation and rotation are not sent."""


@dataclass(kw_only=True)
class FrankyArmConfig:
    """How to reach and drive one Franka arm."""

    robot_ip: str
    """Hostname or IP of the robot's control box (FCI), e.g. 172.16.0.2; franky-sim: its 127.x address."""
    relative_dynamics_factor: float = 0.1
    """Fraction of the robot's max velocity, acceleration and jerk for every motion, in (0, 1]. The
    SafetyLayer refuses an arm faster than its limits allow."""
    connect_timeout_s: float = 3.0
    """Give up connecting after this long. franky waits forever on a host that accepts and stays silent."""
    ignore_realtime: bool = False
    """True: run without a realtime kernel (franky-sim, a development PC). Never on the real robot."""
    gripper: bool = True
    """Whether a Franka Hand is attached (connects it and drives it)."""
    gripper_speed_m_per_s: float = 0.05
    """Finger speed when opening and closing."""
    grasp_force_n: float = 20.0
    """Force the fingers hold a grasped object with."""
    wait_for_motion: bool = True
    """True: a step returns when the TCP has arrived. False: it returns at once; the next step takes over
    the running motion (starting from where the arm is then), and the watchdog stops a motion no step
    follows."""
    settle_tolerance_rad: float = 0.002
    """A waited-for motion has arrived when every joint is this close to its commanded position."""
    settle_timeout_s: float = 1.0
    """Wait at most this long for that (or for the arm to come to rest short of it, as in contact)
    after franky's motion ends. The real arm tracks its command closely; franky-sim lags ~0.3 s."""

    def __post_init__(self) -> None:
        if not isinstance(self.robot_ip, str) or not self.robot_ip or any(c.isspace() for c in self.robot_ip):
            raise ValueError(f"robot_ip={self.robot_ip!r}: a hostname or IP address, e.g. '172.16.0.2'")
        if ":" in self.robot_ip:
            raise ValueError(f"robot_ip={self.robot_ip!r}: libfranka uses fixed ports (1337, 1338); give the "
                             f"address without a port")
        _positive("relative_dynamics_factor", self.relative_dynamics_factor, hi=1.0)
        _positive("connect_timeout_s", self.connect_timeout_s, hi=60.0)
        _positive("gripper_speed_m_per_s", self.gripper_speed_m_per_s, hi=0.2)
        _positive("grasp_force_n", self.grasp_force_n, hi=140.0)
        _positive("settle_tolerance_rad", self.settle_tolerance_rad, hi=0.1)
        _positive("settle_timeout_s", self.settle_timeout_s, hi=10.0)


def _positive(name: str, value: Any, hi: float) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= hi):
        raise ValueError(f"{name}={value!r}: a number in (0, {hi:g}]")


def import_franky() -> Any:
    """``franky`` or ``MissingExtraError`` naming the ``robot`` extra."""
    return require_module("franky", extra="robot")


class FrankyArm(Arm):
    """A Franka arm and its hand, driven by franky. Move it only through a ``SafetyLayer``."""

    def __init__(self, config: FrankyArmConfig):
        super().__init__()
        self.config = config
        self._robot: Any = None
        self._gripper: Any = None
        self._gripper_future: Any = None
        self._waiting_for: str | None = None  # the motion _finish_motion waits for

    def __repr__(self) -> str:
        return f"FrankyArm({self.config.robot_ip})"

    @property
    def relative_dynamics_factor(self) -> float:
        return float(self.config.relative_dynamics_factor)

    @property
    def is_connected(self) -> bool:
        return self._robot is not None

    @requires_no_connection
    def connect(self, timeout_s: float | None = None) -> None:
        """Connect to the robot and (if configured) its gripper, within a deadline.

        franky's connect blocks in C++ with no timeout of its own, so it runs in a daemon thread; a
        connect that misses the deadline is abandoned there (it ends when the peer closes).

        Args:
            timeout_s: the deadline; None: ``config.connect_timeout_s``.

        Raises:
            RobotUnreachableError: refused, unknown host, or no answer within the deadline.
            RealtimeKernelError: no realtime kernel here and ``ignore_realtime`` is off.
            RealRobotError: the robot's server version does not fit.
        """
        franky = import_franky()
        deadline_s = self.config.connect_timeout_s if timeout_s is None else float(timeout_s)
        ip = self.config.robot_ip
        result: dict[str, Any] = {}

        def open_connections() -> None:
            try:
                realtime = (franky.RealtimeConfig.Ignore if self.config.ignore_realtime
                            else franky.RealtimeConfig.Enforce)
                robot = franky.Robot(ip, relative_dynamics_factor=self.config.relative_dynamics_factor,
                                     realtime_config=realtime)
                gripper = franky.Gripper(ip) if self.config.gripper else None
                result["ok"] = (robot, gripper)
            except BaseException as e:  # handed to the caller's thread
                result["error"] = e

        thread = threading.Thread(target=open_connections, name=f"franky-connect-{ip}", daemon=True)
        thread.start()
        thread.join(deadline_s)
        if thread.is_alive():
            raise RobotUnreachableError(
                f"the robot at {ip} accepted no session within connect_timeout_s={deadline_s:g} s; is FCI "
                f"enabled in Desk (and the brakes open), and is {ip} the control box's FCI address?")
        error = result.get("error")
        if error is not None:
            text = str(error)
            if isinstance(error, franky.NetworkException):
                raise RobotUnreachableError(f"cannot connect to the robot at {ip}: {text}") from error
            if isinstance(error, franky.IncompatibleVersionException):
                raise RealRobotError(f"the robot at {ip} speaks another libfranka server version than this franky "
                                     f"wheel ({text}); install the franky build for that robot "
                                     f"(docs/real_robot.md)") from error
            if isinstance(error, franky.RealtimeException):
                raise RealtimeKernelError(text) from error
            raise error
        self._robot, self._gripper = result["ok"]

    def disconnect(self) -> None:
        if self._robot is None:
            return
        try:
            self.stop()
            self._wait_gripper()
        finally:
            # franky closes the connections when its objects go
            self._robot, self._gripper, self._gripper_future, self._gripper_kept = None, None, None, None

    @requires_connection
    def observation(self) -> ArmObservation:
        import numpy as np

        franky = import_franky()
        state = self._robot.state  # one snapshot: joints and pose from the same control tick
        joints = np.asarray(state.q, dtype=np.float64).reshape(NUM_JOINTS).copy()
        T_base_from_tcp = np.asarray(self._robot.model.pose(franky.Frame.EndEffector, state).matrix,
                                     dtype=np.float64).copy()
        width = float(self._gripper.width) if self._gripper is not None else math.nan
        return ArmObservation(joint_positions_rad=joints, gripper_width_m=width, T_base_from_tcp=T_base_from_tcp,
                              timestamp_s=now_s())

    def _stop(self) -> None:
        robot = self._robot
        if robot is None:
            return
        franky = import_franky()
        robot.stop()
        # franky keeps the "preempted" error of a stopped asynchronous motion and raises it at the next
        # move; collect it here so that a stop is not an error. A real fault stays in has_errors.
        try:
            robot.join_motion(1.0)
        except (franky.ControlException, franky.CommandException, franky.ProtocolException):
            pass

    @requires_connection
    def recover(self) -> bool:
        return bool(self._robot.recover_from_errors()) and not bool(self._robot.has_errors)

    # ----- motion hooks (reached only through Arm's permit check) ---------------------------------
    def _start_move_to_pose(self, T_base_from_tcp: Any) -> None:
        import numpy as np

        from real_robot.transforms import matrix_to_quaternion_wxyz, rotation_angle

        franky = import_franky()
        self._waiting_for = None
        target = np.asarray(T_base_from_tcp, dtype=np.float64).reshape(4, 4)
        desired = np.asarray(self._robot.current_cartesian_state.pose.end_effector_pose.matrix)
        if (np.linalg.norm(target[:3, 3] - desired[:3, 3]) < MIN_STEP_M
                and rotation_angle(desired[:3, :3].T @ target[:3, :3]) < MIN_STEP_RAD):
            return  # already commanded there; franky's planner can fail on an empty motion ("error code -111")
        w, x, y, z = matrix_to_quaternion_wxyz(target[:3, :3])
        motion = franky.CartesianMotion(franky.Affine(target[:3, 3], np.array([x, y, z, w])),
                                        franky.ReferenceType.Absolute)
        self._start(motion, "the Cartesian motion", wait=self.config.wait_for_motion)

    def _start_move_to_joint_positions(self, joint_positions_rad: Any) -> None:
        import numpy as np

        franky = import_franky()
        target = np.asarray(joint_positions_rad, dtype=np.float64).reshape(NUM_JOINTS)
        self._start(franky.JointMotion(target), "the joint move", wait=True)

    def _start(self, motion: Any, what: str, wait: bool) -> None:
        # always asynchronously, so that the start returns and a stop can end the motion (a
        # synchronous move is this and join_motion in one call)
        self._waiting_for = None
        with self._franky_errors(what):
            self._robot.move(motion, asynchronous=True)
        self._waiting_for = what if wait else None

    def _finish_motion(self) -> None:
        what, self._waiting_for = self._waiting_for, None
        if what is None:
            return
        with self._franky_errors(what):
            self._robot.join_motion()
        self._wait_until_settled()

    @contextlib.contextmanager
    def _franky_errors(self, what: str) -> Iterator[None]:
        franky = import_franky()
        try:
            yield
        except franky.ControlException as e:
            raise MotionError(f"{self} aborted {what}: {e}; call recover() before the next motion") from e
        except (franky.CommandException, franky.ProtocolException) as e:
            # refused, or ended out of protocol (the robot reported a motion finished that the client
            # still ran): the arm holds still; libfranka's error recovery clears it
            raise MotionError(f"{self} refused {what} or ended it unexpectedly ({type(e).__name__}: {e}); "
                              f"call recover() before the next motion") from e
        except franky.NetworkException as e:
            raise RobotUnreachableError(f"{self} lost its connection during {what}: {e}") from e
        except RuntimeError as e:  # franky's trajectory planner (ruckig) refusing the motion
            raise MotionError(f"{self} could not plan {what}: {e}") from e

    def _wait_until_settled(self) -> None:
        import numpy as np

        deadline_s = time.monotonic() + self.config.settle_timeout_s
        while time.monotonic() < deadline_s:
            state = self._robot.state
            if np.max(np.abs(np.asarray(state.q) - np.asarray(state.q_d))) < self.config.settle_tolerance_rad:
                return
            # at rest short of the target (contact, or franky-sim's steady-state error): arrived too
            if np.max(np.abs(np.asarray(state.dq))) < SETTLED_JOINT_SPEED_RAD_PER_S:
                return
            time.sleep(0.005)

    def _set_gripper(self, close: bool) -> None:
        if self._gripper is None:
            return
        speed = self.config.gripper_speed_m_per_s
        if close:
            # Any final width counts as a grasp: the policy decides, not an object-size guess.
            args = (0.0, speed, self.config.grasp_force_n)
            kwargs = dict(epsilon_inner=0.005, epsilon_outer=1.0)
            if self.config.wait_for_motion:
                self._gripper.grasp(*args, **kwargs)
            else:
                self._gripper_future = self._gripper.grasp_async(*args, **kwargs)
        elif self.config.wait_for_motion:
            self._gripper.open(speed)
        else:
            self._gripper_future = self._gripper.open_async(speed)

    def _gripper_busy(self) -> bool:
        return self._gripper_future is not None and not self._gripper_future.wait(0.0)

    def _wait_gripper(self) -> None:
        if self._gripper_future is not None:
            self._gripper_future.wait(10.0)
            self._gripper_future = None
