"""PutOnPlateInScene25 as a ManiSkill task (CPU or GPU PhysX), with a Panda digital twin.

**Task Description**: put the named object on the plate. Instruction
``"put {object} on {plate}"``. 80 steps at 5 Hz control (500 Hz simulation; ``sim_freq``
lowers it for training).

**Randomizations** (all indexed by the episode id, see ``episodes.py``): the object (one of
the split's objects), the plate, the table-photo overlay composited behind robot and objects,
the cells of the object and the plate (784 pairs of a 6x6 grid), the object's yaw (4); the OOD
variants (``variants.py``) draw others.

**Success Conditions**: see ``rewards.object_on_plate``. Dense reward: ``rewards.dense_reward``
of the reference's staged score, plus ``rewards.shaping_potential`` when ``reward_shaping`` > 0.
Sparse reward: ``rewards.sparse_reward``, 1 while successful after a grasp.

**Expert starts** (training only, ``expert_start_phases``): an episode may begin where the
scripted expert, run from the episode's initial state, enters one of its phases (``"lift"``:
the object just grasped; ``"carry"``: lifted; ``"lower"``: over the plate), so that RL sees the
carry and release from many states, not only from the few grasps its policy makes (starting
from demonstration states, as in reverse-curriculum RL). The phase is a fixed function of the
episode id, so envs that share an initial state share the start too.

The scene is a table whose top is at z = 0.87 m (the Bridge stage's height); every object and
plate of the pack is built once and parked off-table, and each episode moves the selected
two onto it. Every pixel of the main camera that is not the robot, an object or a plate is
replaced by the episode's table photo (segmentation-based green screen). The camera renders at
its own resolution (the camera file's pixels of ``camera_crop``), the green screen applies there,
and the picture is then resized to ``image_size`` by the function that resizes a real camera's
frame (``vla_envs.core.images.resize_rgb``); ``native_render=False`` renders at ``image_size``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import sapien
import torch
from mani_skill.envs.sapien_env import BaseEnv
from mani_skill.sensors.camera import CameraConfig
from mani_skill.utils.registration import register_env
from mani_skill.utils.structs.pose import Pose
from mani_skill.utils.structs.types import SimConfig
from PIL import Image

from vla_envs.backends.maniskill.common import to_maniskill_action
from vla_envs.camera_file import CameraFile, load_camera_file
from vla_envs.core.backend import env_rows
from vla_envs.core.images import resize_rgb
from vla_envs.tasks.put_on_plate import episodes, rewards
from vla_envs.tasks.put_on_plate.assets import AssetPack
from vla_envs.tasks.put_on_plate.expert import OPEN, PHASES, ScriptedExpert
from vla_envs.tasks.put_on_plate.options import REWARD_MODES
from vla_envs.tasks.put_on_plate.robots import ensure_lowpoly_panda  # noqa: F401 (registers it)
from vla_envs.tasks.put_on_plate.variants import get_variant
from vla_envs.tasks.put_on_plate.vision_noise import VisionNoise

TABLE_TOP_Z = 0.87
PANDA_BASE = sapien.Pose(p=[0.30, 0.0, TABLE_TOP_Z], q=[0.0, 0.0, 0.0, 1.0])  # faces -x
CAMERA_UID = "3rd_view_camera"
PARK_X = 3.0  # parked models rest on a shelf far outside the camera's view
SHELF_TOP_Z = 1.0  # parked models rest on it at their own half-height and are put to sleep,
# so the 27 unused models cost no physics (rolling ones would otherwise never come to rest)
EXPERT_START_MAX_STEPS = 80  # the expert's phases time out well before (72 steps at most)


@register_env("VLA-PutOnPlateInScene25-v1", max_episode_steps=80)
class PutOnPlateInScene25Env(BaseEnv):
    """See the module docstring. Built by ``vla_envs.tasks.put_on_plate.task_env``."""

    SUPPORTED_ROBOTS = ["panda", "panda_lowpoly"]
    SUPPORTED_OBS_MODES = ["rgb+segmentation"]
    SUPPORTED_REWARD_MODES = list(REWARD_MODES)

    def __init__(self, *args: Any, pack: AssetPack, variant: str = "PutOnPlateInScene25Main-v3",
                 camera_file: str | Path | None = None, camera_hw: tuple[int, int] = (480, 640),
                 camera_crop: tuple[int, int, int, int] | None = None, native_render: bool = True,
                 robot_uids: str = "panda", sim_freq: int = 500, reward_shaping: float = 0.0,
                 expert_start_phases: tuple[str, ...] = (), **kwargs: Any):
        self.pack = pack
        self.reward_shaping = float(reward_shaping)
        self.expert_start_phases = tuple(PHASES.index(p) for p in expert_start_phases)  # make.py checks names
        self._constructed = False  # BaseEnv.__init__ resets once to build its spaces: no expert start then
        self._requested_sim_freq = sim_freq  # ManiSkill keeps its own _sim_freq
        self.variant = get_variant(variant)
        self.split = self.variant.split(len(pack.plates))
        self.camera: CameraFile = load_camera_file(camera_file)
        self.image_hw = tuple(camera_hw)  # what the policy sees
        self.camera_crop = self.camera.check_crop(camera_crop)
        left, top, right, bottom = self.camera_crop
        # native: the camera's own pixels of the crop, resized afterwards as a real frame is
        self.render_hw = (bottom - top, right - left) if native_render else self.image_hw
        self.num_episodes = self.split.num_episodes
        self._layout = torch.tensor(episodes.layout_xy(self.split.layout), dtype=torch.float32)  # [n, 2|3, 2]
        yaws = torch.as_tensor(episodes.YAWS_RAD, dtype=torch.float32)
        self._yaw_quats = torch.stack([torch.cos(yaws / 2), 0 * yaws, 0 * yaws, torch.sin(yaws / 2)], 1)
        h, w = self.render_hw
        fractions = self.camera.crop_fractions(self.camera_crop)

        def view(file: Path) -> torch.Tensor:
            """A picture of the whole camera view, cropped like the camera and resized to it."""
            image = Image.open(file).convert("RGB")
            box = tuple(f * image.size[i % 2] for i, f in enumerate(fractions))
            return torch.as_tensor(np.array(image.resize((w, h), Image.BILINEAR, box=box)))

        self._overlays = torch.stack([view(o.image_file) for o in pack.overlays])  # uint8 [n_overlays, H, W, 3]
        self._noise = None
        if self.variant.texture_noise or self.variant.image_noise:
            self._noise = VisionNoise(pack.overlays, (h, w), fractions)
        super().__init__(*args, robot_uids=robot_uids, **kwargs)
        self._constructed = True

    # ------------------------------------------------------------------ config
    @property
    def _default_sim_config(self) -> SimConfig:
        return SimConfig(sim_freq=self._requested_sim_freq, control_freq=5, spacing=20)  # make.py checks sim_freq

    @property
    def _default_sensor_configs(self) -> list[CameraConfig]:
        h, w = self.render_hw
        pose = PANDA_BASE * self.camera.sapien_pose_in_base()
        return [CameraConfig(CAMERA_UID, pose, w, h, intrinsic=self.camera.render_intrinsic_for(h, w, self.camera_crop),
                             near=0.01, far=10.0)]

    @property
    def _default_human_render_camera_configs(self) -> CameraConfig:
        h, w = self.render_hw
        return CameraConfig("render_camera", PANDA_BASE * self.camera.sapien_pose_in_base(), w, h,
                            intrinsic=self.camera.render_intrinsic_for(h, w, self.camera_crop), near=0.01, far=10.0)

    # ------------------------------------------------------------------ scene
    def _load_agent(self, options: dict) -> None:
        super()._load_agent(options, PANDA_BASE)

    def _load_lighting(self, options: dict) -> None:
        self.scene.set_ambient_light([0.3, 0.3, 0.3])
        self.scene.add_directional_light([0, 0, -1], [2.2, 2.2, 2.2], shadow=False)
        self.scene.add_directional_light([-1, -0.5, -1], [0.7, 0.7, 0.7])
        self.scene.add_directional_light([1, 1, -1], [0.7, 0.7, 0.7])

    def _build_model(self, info, name: str, index: int, row: float):
        builder = self.scene.create_actor_builder()
        material = sapien.physx.PhysxMaterial(static_friction=1.0, dynamic_friction=1.0, restitution=0.0)
        scale = [info.scales[0]] * 3
        builder.add_multiple_convex_collisions_from_file(
            str(info.collision_file), scale=scale, material=material, density=info.density)
        builder.add_visual_from_file(str(info.visual_file), scale=scale)
        builder.initial_pose = sapien.Pose(p=[PARK_X + row, 0.3 * index, _park_z(info)])
        return builder.build(name=name)

    def _load_scene(self, options: dict) -> None:
        table = self.scene.create_actor_builder()
        half = [0.45, 0.55, TABLE_TOP_Z / 2]
        table.add_box_collision(half_size=half)
        table.add_box_visual(half_size=half, material=sapien.render.RenderMaterial(base_color=[0.55, 0.45, 0.35, 1]))
        table.initial_pose = sapien.Pose(p=[-0.16, 0.0, TABLE_TOP_Z / 2])
        self.table = table.build_static(name="table")
        shelf = self.scene.create_actor_builder()
        shelf.add_box_collision(half_size=[1.0, 4.5, 0.05])
        shelf.initial_pose = sapien.Pose(p=[PARK_X + 0.5, 3.6, SHELF_TOP_Z - 0.05])
        shelf.build_static(name="parking_shelf")
        self.objects = [self._build_model(m, f"obj_{m.model_id}", i, 0.0) for i, m in enumerate(self.pack.objects)]
        self.plates = [self._build_model(m, f"plate_{m.model_id}", i, 1.0) for i, m in enumerate(self.pack.plates)]
        self._obj_bbox = torch.as_tensor(np.stack([m.bbox_size * m.scales[0] for m in self.pack.objects]), dtype=torch.float32)
        self._plate_bbox = torch.as_tensor(np.stack([m.bbox_size * m.scales[0] for m in self.pack.plates]), dtype=torch.float32)
        n = self.num_envs
        self.episode_id = torch.zeros(n, dtype=torch.int64)
        self.sel = {k: torch.zeros(n, dtype=torch.int64) for k in
                    ("object", "plate", "overlay", "position", "yaw", "distractor")}
        self.grasp_streak = torch.zeros(n, dtype=torch.int32)
        self.ever_grasped = torch.zeros(n, dtype=torch.bool)
        self.ever_consecutive = torch.zeros(n, dtype=torch.bool)
        self.prev_score = torch.zeros(n)
        self.score = torch.zeros(n)
        # evaluate() counts each control step once: ManiSkill also calls it in reset() for the whole
        # batch, which on a GPU batch's partial reset would count the other envs' last step again
        self.control_steps = torch.zeros(n, dtype=torch.int64)  # per env, never reset
        self.counted_at = torch.full((n,), -1, dtype=torch.int64)  # control_steps at the last count
        self.obj_bbox_world = torch.zeros(n, 3)
        self.plate_bbox_world = torch.zeros(n, 3)

    def _after_reconfigure(self, options: dict) -> None:
        ids = [a._objs[0].per_scene_id for a in self.objects + self.plates]
        ids += [link._objs[0].entity.per_scene_id for link in self.agent.robot.get_links()]
        self._foreground_ids = torch.tensor(ids, dtype=torch.int32)

    # ------------------------------------------------------------------ episodes
    @property
    def instruction(self) -> list[str]:
        """The instruction of each env's episode."""
        templates = self.variant.instructions
        return [templates[(o + y) % len(templates)].format(object=self.pack.objects[o].name,
                                                           plate=self.pack.plates[p].name)
                for o, p, y in zip(self.sel["object"].tolist(), self.sel["plate"].tolist(),
                                   self.sel["yaw"].tolist())]

    def _initialize_episode(self, env_idx: torch.Tensor, options: dict) -> None:
        b = len(env_idx)
        if "episode_id" in options:
            ids = torch.as_tensor(options["episode_id"], dtype=torch.int64).reshape(-1).cpu()
            if ids.numel() != b:
                raise ValueError(f"options['episode_id'] has {ids.numel()} ids for {b} envs being reset")
        else:
            ids = torch.as_tensor(self._episode_rng.randint(0, self.num_episodes, size=b), dtype=torch.int64)
        decoded = episodes.decode(ids.numpy(), self.split)
        idx = env_idx.cpu()
        self.episode_id[idx] = ids
        for k, v in decoded.items():
            self.sel[k][idx] = torch.as_tensor(v)
        with torch.device(self.device):
            cells = self._layout[self.sel["position"][idx]]  # [b, 2 or 3, 2]: object, plate, third
            quat = self._yaw_quats[self.sel["yaw"][idx]]  # [b, 4]
            ident = torch.tensor([1.0, 0, 0, 0]).repeat(b, 1)
            kind = self.variant.distractor
            extra = self.sel["distractor"][idx]
            for group, chosen, row, xy_col, z, q, has_extra in (
                (self.objects, self.sel["object"][idx], 0.0, 0, episodes.OBJECT_SPAWN_Z, quat, kind == "object"),
                (self.plates, self.sel["plate"][idx], 1.0, 1, episodes.PLATE_SPAWN_Z, ident, kind == "plate"),
            ):
                models = self.pack.objects if group is self.objects else self.pack.plates
                for i, actor in enumerate(group):
                    here = (chosen == i).to(self.device)[:, None]
                    park = torch.tensor([PARK_X + row, 0.3 * i, _park_z(models[i])]).repeat(b, 1)
                    spawn = torch.cat([cells[:, xy_col].to(self.device), torch.full((b, 1), z)], 1)
                    if has_extra:  # the distractor stands on the third cell, turned like its kind's model
                        other = (extra == i).to(self.device)[:, None]
                        third = torch.cat([cells[:, 2].to(self.device), torch.full((b, 1), z)], 1)
                        spawn, here = torch.where(other, third, spawn), here | other
                    pos, rot = torch.where(here, spawn, park), torch.where(here, q.to(self.device), ident)
                    actor.set_pose(Pose.create_from_pq(p=pos, q=rot))
                    # a moved body keeps its velocity: zero it, or the previous episode leaks in
                    actor.set_linear_velocity(torch.zeros(b, 3))
                    actor.set_angular_velocity(torch.zeros(b, 3))
            qpos = torch.as_tensor(self.agent.keyframes["rest"].qpos, dtype=torch.float32).repeat(b, 1)
            if self.variant.init_qpos_noise_rad:
                offsets = episodes.arm_pose_offsets(self.episode_id[idx].cpu().numpy(), self.variant.init_qpos_noise_rad)
                qpos[:, :7] += torch.as_tensor(offsets, dtype=torch.float32)
            self.agent.reset(qpos)
            # the joint drives still aim at the previous episode's last targets: during the settle
            # below they would pull the arm back there, so every episode after the first would
            # start from where the last one ended
            robot = self.agent.robot
            robot.set_joint_drive_targets(qpos, joints=robot.get_active_joints())
            robot.set_pose(PANDA_BASE)
        # parked models sleep before the settle: falling onto the shelf, each would land a little
        # differently after each episode's history, and their shadows moved pixels of the same
        # seed's view (a used env rendered the same reset unlike a new one)
        self._sleep_parked()
        # 0.1 s of physics, as the reference: its settle is written ``0.5`` but divided by the
        # control rate (5 Hz), so it runs sim_freq * 0.1 steps; the initial states stay its own
        self._settle(0.1, idx)
        self._record_bboxes(idx)
        self.grasp_streak[idx] = 0
        self.ever_grasped[idx] = False
        self.ever_consecutive[idx] = False
        # the reset's own evaluate() sets it to the first state's score: with shaping, that is
        # not 0, and the first step must pay only its own progress
        self.prev_score[idx] = float("nan")
        self.counted_at[idx] = -1  # the reset's own evaluate() counts the new episode's first state

    def _after_control_step(self) -> None:
        super()._after_control_step()
        self.control_steps += 1

    def reset(self, seed: Any = None, options: dict | None = None):
        obs, info = super().reset(seed=seed, options=options)
        if self.expert_start_phases and self._constructed:
            env_idx = (options or {}).get("env_idx")
            if env_idx is not None and len(env_idx) < self.num_envs:
                raise ValueError(f"expert_start_phases: the expert drives every env of the batch, so reset all "
                                 f"{self.num_envs} envs at once (got {len(env_idx)}: use auto_reset=False)")
            obs = self._run_expert_start(obs)
        return obs, info

    def _run_expert_start(self, obs: dict) -> dict:
        """Step the scripted expert until each env's episode reaches its start phase (drawn from
        ``expert_start_phases`` by a hash of the episode id); envs already there hold still with
        the gripper as it was. Returns the observation the policy starts from. The expert's
        steps are the env's, so ``evaluate`` sees its grasp (the dense reward's grasp stages are
        paid before the policy's first step), but the vector env's time limit starts after them."""
        phase = episodes.start_phase_index(self.episode_id.cpu().numpy(), len(self.expert_start_phases))
        target = np.array(self.expert_start_phases)[phase]
        expert = ScriptedExpert(self.num_envs)
        grip = np.full(self.num_envs, OPEN, np.float32)
        for _ in range(EXPERT_START_MAX_STEPS):
            todo = expert.phase < target
            if not todo.any():
                break
            action = expert.act(env_rows(self.expert_state()))
            action[~todo, :6] = 0.0
            action[~todo, 6] = grip[~todo]
            grip = action[:, 6].copy()
            obs, *_ = self.step(torch.as_tensor(to_maniskill_action(action), device=self.device))
        return obs

    def _sleep_parked(self) -> None:
        """Put parked models to sleep (CPU PhysX: one body per actor) so they cost nothing."""
        if self.gpu_sim_enabled:
            return
        for actor in self.objects + self.plates:
            body = actor._bodies[0]
            if float(actor.pose.p[0, 0]) > PARK_X - 0.5:
                body.set_linear_velocity([0, 0, 0])
                body.set_angular_velocity([0, 0, 0])
                body.put_to_sleep()

    def _settle(self, seconds: float, idx: torch.Tensor) -> None:
        """Steps the physics ``seconds`` with no control (objects come to rest on the table) for
        the envs being reset, ``idx``. A GPU batch is one physics scene, so stepping it moves every
        env: the others are put back where they were, as if no time had passed for them."""
        others = None
        if self.gpu_sim_enabled:
            self.scene._gpu_apply_all()
            if len(idx) < self.num_envs:
                keep = torch.ones(self.num_envs, dtype=torch.bool, device=idx.device)
                keep[idx] = False
                others, before = keep.nonzero().flatten(), self.scene.get_sim_state()
        for _ in range(int(self.sim_freq * seconds + 1e-9)):
            self.scene.step()
        if self.gpu_sim_enabled:
            self.scene._gpu_fetch_all()
            if others is not None:
                self.scene.set_sim_state(before, others)
                self.scene._gpu_apply_all()
                self.scene.px.gpu_update_articulation_kinematics()
                self.scene._gpu_fetch_all()

    def _selected_poses(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """(p [N, 3], q [N, 4]) of each env's selected object and plate, gathered over the
        models some env uses (one on the CPU backend), without a per-env loop."""
        def gather(group, chosen):
            used = chosen.unique()
            p = torch.stack([group[u].pose.p for u in used.tolist()])  # [n_used, N, 3]
            q = torch.stack([group[u].pose.q for u in used.tolist()])
            row = torch.searchsorted(used, chosen).to(p.device)
            ar = torch.arange(self.num_envs, device=p.device)
            return p[row, ar], q[row, ar]
        return gather(self.objects, self.sel["object"]), gather(self.plates, self.sel["plate"])

    def _record_bboxes(self, idx: torch.Tensor) -> None:
        """World-axis bounding-box sizes after settling (the yaw changes the object's)."""
        (_, oq), (_, pq) = self._selected_poses()
        for sizes, q, chosen, out in ((self._obj_bbox, oq, self.sel["object"], self.obj_bbox_world),
                                      (self._plate_bbox, pq, self.sel["plate"], self.plate_bbox_world)):
            half = sizes[chosen[idx]] / 2  # [b, 3]
            rot = _quat_to_matrix(q[idx.to(q.device)].cpu().float())  # [b, 3, 3]
            out[idx] = 2 * (rot.abs() @ half[:, :, None])[..., 0]

    # ------------------------------------------------------------------ evaluation
    def _grasping_selected(self) -> torch.Tensor:
        """bool ``[N]`` (CPU): the gripper holds each env's selected object now."""
        grasped = torch.zeros(self.num_envs, dtype=torch.bool)
        for i, obj in enumerate(self.objects):
            here = self.sel["object"] == i
            if here.any():
                grasped |= here & self.agent.is_grasping(obj).cpu()
        return grasped

    def evaluate(self) -> dict[str, torch.Tensor]:
        new = self.control_steps != self.counted_at  # envs whose state this evaluate() has not counted
        self.counted_at = self.control_steps.clone()
        # the step the PositionChange object jumps is judged where it lands, as the observation
        # rendered after this evaluate() shows it (and as the reference moves it before judging)
        self._maybe_move_object(new)
        (op, _), (pp, _) = self._selected_poses()
        n = self.num_envs
        grasped = self._grasping_selected()
        force = torch.zeros(n)
        for i, obj in enumerate(self.objects):
            here = (self.sel["object"] == i)
            if here.any():
                for j, plate in enumerate(self.plates):
                    pair = here & (self.sel["plate"] == j)
                    if pair.any():
                        f = torch.linalg.norm(self.scene.get_pairwise_contact_forces(obj, plate), dim=-1).cpu()
                        force = torch.where(pair, f, force)
        self.grasp_streak = torch.where(new, rewards.update_grasp_streak(self.grasp_streak, grasped),
                                        self.grasp_streak)
        self.ever_grasped |= grasped & new
        self.ever_consecutive |= self.grasp_streak >= rewards.CONSECUTIVE_GRASP_STEPS
        success = rewards.object_on_plate(op.cpu(), pp.cpu(), self.obj_bbox_world, self.plate_bbox_world, force)
        self.score = rewards.staged_score(self.ever_grasped, self.ever_consecutive, success)
        if self.reward_shaping:
            tcp = self.agent.tcp.pose.p.cpu()
            self.score = self.score + rewards.shaping_potential(
                torch.linalg.norm(tcp - op.cpu(), dim=1), torch.linalg.norm((op - pp)[:, :2].cpu(), dim=1),
                self.ever_grasped, self.reward_shaping)
        self.prev_score = torch.where(self.prev_score.isnan(), self.score, self.prev_score)
        return {"success": success.to(self.device), "is_grasped": grasped.to(self.device),
                "consecutive_grasp": self.ever_consecutive.to(self.device),
                "contact_force": force.to(self.device)}

    def expert_state(self) -> dict[str, np.ndarray]:
        """Privileged state for the scripted expert (never an observation): world poses of
        the TCP, the selected object and plate (xyz + wxyz), the object's bbox size, the
        plate's ``on_plate_radius`` (metres: how near the plate's centre in the table plane an
        object resting on it must be to count as placed, as ``evaluate`` judges it), and whether
        the gripper holds the object now (``grasped``, as ``evaluate`` judges it)."""
        (op, oq), (pp, pq) = self._selected_poses()
        tcp = self.agent.tcp.pose.raw_pose
        return {"tcp": tcp.cpu().numpy(), "object": torch.cat([op, oq], -1).cpu().numpy(),
                "plate": torch.cat([pp, pq], -1).cpu().numpy(),
                "object_size": self._obj_bbox[self.sel["object"]].numpy(),
                "on_plate_radius": rewards.on_plate_radius(self.plate_bbox_world).numpy(),
                "grasped": self._grasping_selected().numpy(),
                "base_yaw": np.full(self.num_envs, np.pi)}

    def _maybe_move_object(self, new: torch.Tensor) -> None:
        """PositionChange variant: at the configured step the object jumps to the layout's third cell,
        out of the gripper if held, and is dropped there as at the episode's start (spawn height,
        initial yaw, at rest), as the reference's (the policy must re-target). ``new``: the envs
        whose step this is the first evaluate() of (it moves once)."""
        k = self.variant.move_object_at_step
        if not k:
            return
        move = new & (self.elapsed_steps.cpu() == k)
        if not move.any():
            return
        far = self._layout[self.sel["position"], 2]  # [N, 2]
        for i, obj in enumerate(self.objects):
            sel = move & (self.sel["object"] == i)
            if sel.any():
                p, q = obj.pose.p.clone(), obj.pose.q.clone()
                rows = sel.to(p.device)
                p[rows, :2] = far[sel].to(p.device)
                p[rows, 2] = episodes.OBJECT_SPAWN_Z
                q[rows] = self._yaw_quats[self.sel["yaw"][sel]].to(q.device)
                obj.set_pose(Pose.create_from_pq(p=p, q=q))
                for velocity, setter in ((obj.linear_velocity, obj.set_linear_velocity),
                                         (obj.angular_velocity, obj.set_angular_velocity)):
                    velocity = velocity.clone()
                    velocity[rows] = 0.0
                    setter(velocity)

    def compute_dense_reward(self, obs: Any, action: torch.Tensor, info: dict) -> torch.Tensor:
        reward = rewards.dense_reward(self.score, self.prev_score)  # self.score: this step's evaluate()
        self.prev_score = self.score
        return reward.to(self.device)

    def compute_sparse_reward(self, obs: Any, action: torch.Tensor, info: dict) -> torch.Tensor:
        return rewards.sparse_reward(info["success"].cpu(), self.ever_grasped).to(self.device)

    def _get_obs_extra(self, info: dict) -> dict:
        return {"tcp_pose": self.agent.tcp.pose.raw_pose}

    # ------------------------------------------------------------------ green screen
    def _get_obs_sensor_data(self, apply_texture_transforms: bool = True) -> dict:
        data = super()._get_obs_sensor_data(apply_texture_transforms)
        cam = data[CAMERA_UID]
        if "segmentation" in cam:
            sel = self.sel["overlay"]
            rgb, keep = composite(cam["rgb"], cam["segmentation"], self._overlays[sel], self._foreground_ids)
            if self._noise is not None:
                rgb = self._noise(rgb, keep, sel, self.variant.texture_noise, self.variant.image_noise)
            cam["rgb"] = rgb
        cam["rgb"] = resize_rgb(cam["rgb"][..., :3], self.image_hw)  # as a real frame is (franka/*)
        return data


def _park_z(info) -> float:
    """Height at which a model rests on the parking shelf (its origin is its bbox centre)."""
    return SHELF_TOP_Z + float(info.bbox_size[2] * info.scales[0]) / 2 + 0.001


def composite(rgb: torch.Tensor, segmentation: torch.Tensor, overlay: torch.Tensor,
              foreground_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Green screen: keep pixels whose actor id is in ``foreground_ids``, else the overlay.

    Shapes: rgb uint8 ``[B, H, W, 3]``, segmentation ``[B, H, W, 1]``, overlay uint8
    ``[B, H, W, 3]``, foreground_ids ``[K]`` -> (uint8 ``[B, H, W, 3]``, the kept pixels bool ``[B, H, W]``).
    """
    keep = torch.isin(segmentation[..., 0].to(torch.int32), foreground_ids.to(segmentation.device))
    return torch.where(keep[..., None], rgb, overlay.to(rgb.device)), keep


def _quat_to_matrix(q: torch.Tensor) -> torch.Tensor:
    """wxyz quaternions ``[B, 4]`` -> rotation matrices ``[B, 3, 3]``."""
    w, x, y, z = q.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
    ], -1).reshape(-1, 3, 3)

