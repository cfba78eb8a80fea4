"""One LIBERO env (robosuite + MuJoCo) as a ``TaskEnv``: any task of its group, switched in place.

Initial-state id ``k`` of a group of tasks is ``(task, init) = divmod(k, 50)``: task ``task`` of the
group, official initial state ``init``. A reset to another task rebuilds the simulator inside
the same process (no worker respawn); a reset to the same task reuses it (soft reset).

The OpenVLA / OpenVLA-OFT evaluation protocol is the default: after a reset, ``settle_steps``
(10) no-op actions let objects come to rest before the first observation; both camera images are
rotated 180 degrees (LIBERO renders them upside down, and OpenVLA was trained on rotated ones);
rendered at 256 px and resized to ``image_size`` by ``vla_envs.core.images.resize_rgb``, as the
reference's image processor resizes its 256 px renders (``native_render=False``: rendered at
``image_size``). ``state`` is the end-effector position (3), its orientation as axis-angle (3) and the two
gripper finger positions (2), as OpenVLA-OFT's proprio input.

Actions: the project's 7-D convention is LIBERO's own: OSC_POSE delta end-effector, position
scaled to +/-0.05 m and axis-angle to +/-0.5 rad by the controller, gripper -1 open / +1 close;
20 Hz. Reward: 1.0 at success (sparse), scaled by the trainer's ``env.*.reward_coef``.
"""

from __future__ import annotations

import contextlib
import io
from typing import Any

import numpy as np

from vla_envs.backends.libero.rendering import ensure_gl
from vla_envs.backends.libero.suites import INIT_STATES_PER_TASK, group_tasks, init_states, max_steps, scene_id
from vla_envs.core.images import resize_rgb
from vla_envs.core.spaces import make_action_space, make_observation_space
from vla_envs.core.task_env import TaskEnv

SETTLE_ACTION = np.array([0, 0, 0, 0, 0, 0, -1], np.float64)
STATE_DIM = 8
NATIVE_SIDE = 256  # the protocol's (and the reference's) camera size


def quat_to_axis_angle(q: np.ndarray) -> np.ndarray:
    """(x, y, z, w) unit quaternion -> axis-angle ``[3]`` (robosuite's convention)."""
    x, y, z, w = q
    w = float(np.clip(w, -1.0, 1.0))
    s = np.sqrt(max(1.0 - w * w, 0.0))
    if s < 1e-8:
        return np.zeros(3)
    return np.array([x, y, z]) / s * 2.0 * np.arccos(w)


class LiberoTaskEnv(TaskEnv):
    """Args:
        group: a registered task group (``libero_spatial`` ... ``libero_90``, ``libero_130``).
        image_size: side of both pictures in pixels (256: the eval protocol).
        wrist: also return the wrist camera as ``wrist_image``.
        settle_steps: no-op steps after each reset (10: the eval protocol).
        fast_render: turn multisample anti-aliasing off (~1.7x faster rendering, different
            pixels): for training throughput only, never for evaluation.
        native_render: render at ``NATIVE_SIDE`` and resize to ``image_size``; False: render at
            ``image_size``.
    """

    metadata = {"render_modes": []}

    def __init__(self, group: str, image_size: int = 256, wrist: bool = True, settle_steps: int = 10,
                 fast_render: bool = False, native_render: bool = True):
        ensure_gl()
        self.group = group
        self.tasks = group_tasks(group)
        self.image_size = int(image_size)
        self.wrist = bool(wrist)
        self.settle_steps = int(settle_steps)
        self.fast_render = bool(fast_render)
        self.render_side = NATIVE_SIDE if native_render else self.image_size
        self.max_episode_steps = max_steps(group)
        self.num_initial_states = len(self.tasks) * INIT_STATES_PER_TASK
        hw = (self.image_size, self.image_size)
        self.observation_space = make_observation_space(hw, STATE_DIM, hw if self.wrist else None)
        self.action_space = make_action_space()
        self._env = None
        self._task_index = -1

    # ------------------------------------------------------------------ the simulator
    def _build(self, task_index: int) -> None:
        from libero.libero.envs import OffScreenRenderEnv

        if self._env is not None:
            self._env.close()
            self._env = None
        task = self.tasks[task_index]
        cameras = ["agentview", "robot0_eye_in_hand"] if self.wrist else ["agentview"]
        with contextlib.redirect_stdout(io.StringIO()):
            # ignore_done: the time limit is the vector env's; robosuite's own (1000 steps, settling
            # included) would end a longer episode with a raw "executing action in terminated episode"
            env = OffScreenRenderEnv(bddl_file_name=task.bddl_file, camera_heights=self.render_side,
                                     camera_widths=self.render_side, camera_names=cameras, hard_reset=False,
                                     ignore_done=True)
        if self.fast_render:  # no multisampling: rebuild the offscreen buffers without it
            sim = env.env.sim
            sim.model._model.vis.quality.offsamples = 0
            ctx = sim._render_context_offscreen
            ctx.gl_ctx.make_current()
            ctx.con.free()
            ctx._set_mujoco_context_and_buffers()
        self._env = env
        self._task_index = task_index

    def _obs(self, raw: dict[str, np.ndarray]) -> dict[str, Any]:
        state = np.concatenate([raw["robot0_eef_pos"], quat_to_axis_angle(raw["robot0_eef_quat"]),
                                raw["robot0_gripper_qpos"]]).astype(np.float32)
        hw = (self.image_size, self.image_size)
        obs = {"image": np.ascontiguousarray(resize_rgb(raw["agentview_image"][::-1, ::-1], hw))}
        if self.wrist:
            obs["wrist_image"] = np.ascontiguousarray(resize_rgb(raw["robot0_eye_in_hand_image"][::-1, ::-1], hw))
        obs["state"] = state
        obs["instruction"] = self.tasks[self._task_index].language
        return obs

    def task_of(self, state_id: int) -> tuple[int, int]:
        """(task index in the group, official init-state index) of an initial-state id."""
        if not 0 <= state_id < self.num_initial_states:
            raise ValueError(f"initial-state id {state_id} out of range for {self.group}: allowed "
                             f"0..{self.num_initial_states - 1} ({len(self.tasks)} tasks x {INIT_STATES_PER_TASK})")
        return divmod(state_id, INIT_STATES_PER_TASK)

    # ------------------------------------------------------------------ gymnasium API
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        super().reset(seed=seed)
        state_id = self.state_id_from(seed, options)
        task_index, init_index = self.task_of(state_id)
        task = self.tasks[task_index]
        if task_index != self._task_index or self._env is None:
            self._build(task_index)  # another task: a new simulator, same process
        # LIBERO places fixtures (stove, cabinet, ...) with numpy's global generator, into model
        # parameters that set_init_state does not restore: drawn from the state's LIBERO-130 id, a
        # (task, initial state) is one scene, in its suite and in LIBERO-130 alike
        outer = np.random.get_state()
        np.random.seed(scene_id(task, init_index))
        try:
            self._env.reset()
        finally:
            np.random.set_state(outer)
        # a soft reset keeps the gripper's command (robosuite integrates it step by step in
        # current_action): the last episode's close would carry into this one
        for robot in self._env.env.robots:
            robot.gripper.current_action = np.zeros(robot.gripper.dof)
        raw = self._env.set_init_state(init_states(task)[init_index])
        for _ in range(self.settle_steps):
            raw, _, _, _ = self._env.step(SETTLE_ACTION)
        return self._obs(raw), {"task": task.name, "init_state": init_index}

    def step(self, action: np.ndarray):
        raw, _, _, _ = self._env.step(np.asarray(action, np.float64))
        success = bool(self._env.check_success())
        return self._obs(raw), float(success), success, False, {"success": success}

    def set_joint_positions(self, positions: dict[str, float]) -> bool:
        """Sets named joints (e.g. a drawer's) and recomputes the scene; returns whether the task
        is solved now. For scripted checks of the success logic."""
        sim = self._env.sim
        for name, value in positions.items():
            sim.data.qpos[sim.model.jnt_qposadr[sim.model.joint_name2id(name)]] = value
        sim.forward()
        return bool(self._env.check_success())

    def sim_state(self) -> np.ndarray:
        return self._env.get_sim_state()

    def fixture_positions(self) -> dict[str, list[float]]:
        """Where the scene's fixtures stand (model parameters, not part of ``sim_state``)."""
        inner = self._env.env
        model = inner.sim.model
        return {name: model.body_pos[model.body_name2id(fixture.root_body)].tolist()
                for name, fixture in inner.fixtures_dict.items()}

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None
