"""``FrankaBackend``: one real Franka and its third-person camera as a ``BatchedBackend`` of one env.

Everything the env contract decides (time limit, chunks, ``valid``, episode metrics) stays in
``ChunkVectorEnv``; this class only turns the twin's observation and action convention into
robot I/O (``vla_envs.backends.franka.twin``). Every command goes through the ``SafetyLayer``:
the backend never holds a way around it.
"""

from __future__ import annotations

import time

import numpy as np

from vla_envs.core.backend import BatchedBackend, StepResult
from vla_envs.core.spaces import make_action_space, make_observation_space

from .operator import Operator
from .twin import CONTROL_PERIOD_S, STATE_DIM, twin_image, twin_scaled_action, twin_state


class FrankaBackend(BatchedBackend):
    """A real arm as one env (``can_skip_envs``: nothing is executed after an episode ends).

    Args:
        safety: the arm behind its safety layer (connected; homed to the twin's rest pose at reset).
        camera: the connected third-person camera.
        instruction: what the policy is asked to do (the same in every episode).
        image_size: side of the policy's image (the twin's ``image_size``).
        camera_crop: the twin's ``camera_crop`` (pixels of the camera file), or None.
        camera_hw: the camera file's (height, width); frames of another size are refused.
        undistort: the camera file's ``undistorter()``: each frame made the pinhole picture the twin renders.
        time_limit: steps per episode (the twin's: 80).
        operator: resets the scene and labels success / failure.
        max_frame_age_ms: a frame older than this when the observation is taken stops the episode.
        control_period_s: one step's duration (the twin's 5 Hz).
    """

    num_envs = 1
    can_skip_envs = True
    num_initial_states = 1
    """One: the operator sets the scene up; the id carries no information."""

    def __init__(self, safety, camera, *, instruction: str, image_size: int = 64,
                 camera_crop: tuple[int, int, int, int] | None = None, camera_hw: tuple[int, int] | None = None,
                 time_limit: int = 80, operator: Operator, max_frame_age_ms: float = 200.0,
                 control_period_s: float = CONTROL_PERIOD_S, undistort=None):
        from real_robot.safety import CLAMP_KINDS

        if not isinstance(instruction, str) or not instruction.strip():
            raise ValueError("instruction must be a non-empty string, e.g. 'put carrot on plate'")
        self.safety, self.camera, self.operator = safety, camera, operator
        self.instruction, self.image_size = instruction, image_size
        self.camera_crop, self.camera_hw, self.undistort = camera_crop, camera_hw, undistort
        self.max_episode_steps = int(time_limit)
        self.max_frame_age_ms, self.control_period_s = float(max_frame_age_ms), float(control_period_s)
        side = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        self.single_observation_space = make_observation_space(side, STATE_DIM)
        self.single_action_space = make_action_space()
        self.episode_counters = tuple(f"clamp_{kind}" for kind in CLAMP_KINDS)
        self.last_sent = None
        """The ``SentCommand`` of the last step (what really reached the arm)."""
        self.sent_log: list = []
        """Every step's ``SentCommand``, in order; a recorder reads and clears it."""
        self.timing: dict[str, float] = {}
        """Seconds of the last step: ``send`` (safety + arm), ``camera``, ``preprocess``."""

    def _observe(self) -> dict[str, np.ndarray]:
        t0 = time.perf_counter()
        frame = self.camera.read_latest(self.max_frame_age_ms)  # StaleFrameError stops the episode
        arm = self.safety.observation()
        t1 = time.perf_counter()
        obs = {"image": twin_image(frame.image, self.image_size, self.camera_crop, self.camera_hw, self.undistort)[None],
               "state": twin_state(arm.joint_positions_rad, arm.gripper_width_m, arm.T_base_from_tcp)[None]}
        self.timing.update(camera=t1 - t0, preprocess=time.perf_counter() - t1)
        return obs

    def reset(self, env_ids: np.ndarray, state_ids: np.ndarray) -> tuple[dict[str, np.ndarray], list[str]]:
        self.safety.stop()
        self.operator.wait_for_reset(self.instruction)
        self.safety.home()
        self.safety.open_gripper()
        self.safety.pop_clamp_counts()  # the reset's commands belong to no episode
        return self._observe(), [self.instruction]

    def step(self, actions: np.ndarray, active: np.ndarray) -> StepResult:
        counts = {name: np.zeros(1, np.int64) for name in self.episode_counters}
        if not active[0]:  # the contract never asks this of a backend that can skip; keep it harmless
            obs = self._observe()
            return StepResult(obs, np.zeros(1, np.float32), np.zeros(1, bool), np.zeros(1, bool), counts)
        t0 = time.perf_counter()
        self.last_sent = self.safety.send_action(twin_scaled_action(actions[0]))
        self.sent_log.append(self.last_sent)
        self.timing["send"] = time.perf_counter() - t0
        rest = self.control_period_s - (time.perf_counter() - t0)
        if rest > 0:
            time.sleep(rest)  # keep the twin's 5 Hz when the motion returns early
        obs = self._observe()
        for kind, n in self.safety.pop_clamp_counts().items():
            counts[f"clamp_{kind}"][0] = n
        label = self.operator.poll_label()
        success = np.array([label == "success"])
        return StepResult(obs, success.astype(np.float32), np.array([label is not None]), success, counts)

    def close(self) -> None:
        """Stops the arm and releases it and the camera (the backend owns both). Idempotent. A Ctrl-C
        or SIGTERM meanwhile is delivered once all three are done."""
        from real_robot.lifecycle import deferred_interrupts

        with deferred_interrupts():
            for release in (self.safety.close, self.safety.arm.disconnect, self.camera.disconnect):
                try:
                    release()
                except Exception:  # noqa: BLE001  closing must go on, and not hide the error that led here
                    pass
