"""A scripted pick-and-place expert in the task's own action space (normalised delta EEF +
gripper), driven by privileged state. No motion planner: straight-line moves in Cartesian
space, phase by phase, which is what a 5 Hz delta-pose controller can follow.

Phases: align the gripper across the object's long axis above it -> descend -> close ->
lift -> carry above the plate -> lower -> open -> retreat.
"""

from __future__ import annotations

import numpy as np

MAX_STEP_M, MAX_ROT_RAD = 0.1, 0.1  # what an action of 1.0 means for the Panda's controller
HOVER_M, CARRY_M, RELEASE_M = 0.10, 0.12, 0.045
OPEN, CLOSE = -1.0, 1.0
FINGERTIP_CLEARANCE_M = 0.008
TAKE_OVER_DESCEND_M = 0.03  # lateral offset from the object under which a take-over descends directly
PHASES = ("above", "descend", "close", "lift", "carry", "lower", "open", "retreat")


def _yaw(q: np.ndarray) -> float:
    w, x, y, z = q
    return float(np.arctan2(2 * (w * z + x * y), 1 - 2 * (y * y + z * z)))


def _gripper_axis_angle(q: np.ndarray) -> float:
    """Angle in the xy plane of the TCP's y axis (the direction the fingers close along)."""
    w, x, y, z = q
    r01, r11 = 2 * (x * y - z * w), 1 - 2 * (x * x + z * z)
    return float(np.arctan2(r11, r01))


def _wrap_half_pi(a: float) -> float:
    """Wrap to [-pi/2, pi/2): a parallel gripper is symmetric under a half turn."""
    return (a + np.pi / 2) % np.pi - np.pi / 2


class ScriptedExpert:
    """Per-env phase machines. ``act(states)`` -> actions float32 ``[N, 7]``.

    Closed loop: every step re-plans from the privileged state, so it recovers from actions that
    were not its own (``vla-envs collect-demos --action-noise`` executes perturbed actions and
    records the expert's).

    Args:
        num_envs: batch size.
        seed: unused (the expert is deterministic); accepted for a uniform expert constructor.
        max_speed: the largest translation command per axis, as a fraction of the controller's
            full step (10 cm per control step). Below 1 the moves take more, smaller steps: the
            reach towards the object becomes an approach that a policy can correct step by step
            from what it sees, where at 1.0 it is one jump decided from the first frame.

    Raises:
        ValueError: ``max_speed`` outside ``(0, 1]``.
    """

    def __init__(self, num_envs: int, seed: int = 0, max_speed: float = 1.0):
        if not 0.0 < max_speed <= 1.0:
            raise ValueError(f"max_speed must be in (0, 1], got {max_speed}")
        self.max_speed = max_speed
        self.phase = np.zeros(num_envs, np.int64)
        self.timer = np.zeros(num_envs, np.int64)

    def reset(self, env_ids: np.ndarray | None = None) -> None:
        ids = slice(None) if env_ids is None else env_ids
        self.phase[ids] = 0
        self.timer[ids] = 0

    def take_over(self, env_ids: np.ndarray, states: list[dict[str, np.ndarray]]) -> None:
        """Start envs ``env_ids`` mid-episode, from wherever another policy left them (``states``
        are theirs, in order): a gripper that holds the object (``grasped``) keeps it, rises to
        the carry height and carries it on; one within reach of the object above it descends
        from there; any other goes back above the object first."""
        for i, s in zip(np.asarray(env_ids, np.int64), states):
            lateral = float(np.linalg.norm(s["object"][:2] - s["tcp"][:2]))
            above_it = s["tcp"][2] > s["object"][2]
            if bool(s.get("grasped", False)):
                self.phase[i] = PHASES.index("lift")
            else:
                self.phase[i] = PHASES.index("descend") if lateral < TAKE_OVER_DESCEND_M and above_it else 0
            self.timer[i] = 0

    def act(self, states: list[dict[str, np.ndarray]]) -> np.ndarray:
        return np.stack([self._act_one(i, s) for i, s in enumerate(states)]).astype(np.float32)

    def _act_one(self, i: int, s: dict[str, np.ndarray]) -> np.ndarray:
        tcp, obj, plate = s["tcp"], s["object"], s["plate"]
        phase = PHASES[self.phase[i]]
        # close the fingers around the object's middle, but keep the finger pads (~1 cm below the
        # TCP) off the table; the plate's origin is at table height. With 2 cm, the TCP stopped at
        # the top edge of objects under 3 cm tall and a third of all grasps closed on air.
        grasp_z = max(obj[2], plate[2] + FINGERTIP_CLEARANCE_M)
        target, grip, rot = tcp[:3].copy(), OPEN, 0.0
        if phase in ("above", "descend"):
            target = np.array([obj[0], obj[1], grasp_z + (HOVER_M if phase == "above" else 0.0)])
            want = _yaw(obj[3:]) + np.pi / 2  # fingers close across the long axis
            rot = _wrap_half_pi(want - _gripper_axis_angle(tcp[3:]))
        elif phase in ("close", "lift"):
            grip = CLOSE
            if phase == "lift":
                target = np.array([tcp[0], tcp[1], plate[2] + CARRY_M])
        elif phase in ("carry", "lower"):
            grip = CLOSE
            z = plate[2] + (CARRY_M if phase == "carry" else RELEASE_M)
            target = np.array([plate[0], plate[1], z])
        elif phase == "open":
            target = tcp[:3]
        else:  # retreat
            target = np.array([tcp[0], tcp[1], plate[2] + CARRY_M + 0.05])
        delta = target - tcp[:3]
        done = self._phase_done(phase, delta, rot, int(self.timer[i]))
        self.timer[i] += 1
        if done and self.phase[i] < len(PHASES) - 1:
            self.phase[i] += 1
            self.timer[i] = 0
        # world -> robot base frame (the base is yawed by base_yaw about z)
        c, sn = np.cos(-s["base_yaw"]), np.sin(-s["base_yaw"])
        base_delta = np.array([c * delta[0] - sn * delta[1], sn * delta[0] + c * delta[1], delta[2]])
        move = np.clip(base_delta / MAX_STEP_M, -self.max_speed, self.max_speed)
        action = np.zeros(7)
        action[:3] = move
        # the controller's rotation frame follows the tool, whose z axis points down: a positive
        # z rotation turns the gripper clockwise seen from above (measured), hence the minus
        action[5] = np.clip(-rot / MAX_ROT_RAD, -1, 1)
        action[6] = grip
        return action

    @staticmethod
    def _phase_done(phase: str, delta: np.ndarray, rot: float, ticks: int) -> bool:
        """A phase ends when its target is reached, or after a time-out (never stall)."""
        if phase in ("close", "open"):
            return ticks >= 2  # the fingers need two control steps (0.4 s)
        tolerance = 0.012 if phase in ("descend", "lower") else 0.02
        # a quarter turn at the controller's 0.1 rad per step takes 16 steps: wait for it
        limit = 20 if phase == "above" else 12
        return bool(np.linalg.norm(delta) < tolerance and abs(rot) < 0.05) or ticks >= limit
