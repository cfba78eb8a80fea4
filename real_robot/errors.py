"""Exceptions raised by real_robot. Each names what was wrong and what is allowed or what to do."""

from __future__ import annotations


class RealRobotError(Exception):
    """Base class of every error raised by real_robot."""


class DeviceNotConnectedError(RealRobotError, ConnectionError):
    """A device was used before ``connect()`` or after ``disconnect()``."""


class DeviceAlreadyConnectedError(RealRobotError, ConnectionError):
    """``connect()`` was called on a device that is connected."""


class DeviceNotFoundError(RealRobotError, ConnectionError):
    """No device with the configured identity (a camera serial) is attached; the message lists what is."""


class RobotUnreachableError(RealRobotError, ConnectionError):
    """The robot did not answer: refused, unknown host, or silent past the connect deadline."""


class MotionError(RealRobotError, RuntimeError):
    """The robot aborted or refused a motion (a reflex, a preempted move); call ``recover()``."""


class UnsafeActionError(RealRobotError, ValueError):
    """An action the safety layer refuses outright (NaN, inf, wrong shape); nothing was sent."""


class SafetyBypassError(RealRobotError, RuntimeError):
    """A motion command reached an arm without passing through its ``SafetyLayer``."""


class RealtimeKernelError(RealRobotError):
    """This PC has no realtime kernel (or may not use it), and the arm's config asks for one."""

    def __init__(self, detail: str, how_to_skip: str = "set ignore_realtime=True"):
        super().__init__(f"no realtime kernel on this PC ({detail}); install one for the real robot, or {how_to_skip} "
                         f"for franky-sim")
        self.detail = detail


class StaleFrameError(RealRobotError, TimeoutError):
    """The newest camera frame is older than allowed, or no frame arrived in time."""


class StaleStateError(RealRobotError, TimeoutError):
    """The arm's newest state is older than allowed (its publisher stopped); nothing is sent on it."""


class InvalidStateError(RealRobotError, ValueError):
    """The arm reports a state that is not one (a TCP pose that is no rigid transform, NaN); nothing
    is sent on it."""


class MissingExtraError(RealRobotError, ImportError):
    """A vendor SDK is not installed; the message names the pip extra that provides it."""

    def __init__(self, module: str, extra: str = "robot", cause: BaseException | None = None):
        detail = f" ({cause})" if cause is not None else ""
        super().__init__(f"{module} is not installed{detail}; install it with: pip install \"vla-rl[{extra}]\" "
                         f"(or: bash scripts/setup.sh {extra})")
        self.module = module
        self.extra = extra


def require_module(module: str, extra: str = "robot"):
    """Import a vendor SDK or raise ``MissingExtraError`` naming the extra that installs it.

    Args:
        module: the module to import, e.g. ``"franky"``.
        extra: the pip extra of vla-rl that provides it.

    Returns:
        The imported module.

    Raises:
        MissingExtraError: the module cannot be imported.
    """
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise MissingExtraError(module, extra, e) from e
