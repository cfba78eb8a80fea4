"""The twin sees through its camera file: 3-D points of the real ManiSkill scene (the TCP at
several joint configurations, fixed points over the table) land on the pixels that the file's K
and ``T_base_from_cam`` project them to, at 640 x 480 (CPU PhysX, lavapipe).

Each point is marked by a small kinematic sphere added to the scene; its pixel in the render is
the centroid of its segmentation mask (the robot's visuals are hidden so nothing occludes it).
"""

from __future__ import annotations

import numpy as np
import pytest

from calibration.intrinsics import Intrinsics
from calibration.synthetic import look_at
from calibration.transforms import invert

WIDTH, HEIGHT = 640, 480
K = np.array([[610.0, 0.0, 331.4], [0.0, 606.0, 233.2], [0.0, 0.0, 1.0]])
# beside and above the table, far enough to see the whole arm
T_BASE_FROM_CAM = look_at([1.50, -0.70, 0.80], [0.25, 0.0, 0.32])
ARM_QPOS = [None,  # the twin's rest pose
            [0.5, 0.1, -0.3, -2.3, 0.1, 2.4, 0.4],
            [-0.6, 0.5, 0.2, -1.5, -0.2, 2.1, 1.2],
            [0.2, -0.3, 0.1, -2.6, 0.0, 2.8, 0.8]]
FIXED_POINTS_BASE = np.array([[0.75, 0.30, 0.03], [0.30, -0.45, 0.30], [0.10, -0.40, 0.60], [0.05, 0.30, 0.70]])
MARKER_RADIUS_M = 0.015


def project_px(p_base: np.ndarray) -> tuple[np.ndarray, float]:
    """Pixel (OpenCV convention: pixel centres at integers) and depth of a base-frame point."""
    p_cam = invert(T_BASE_FROM_CAM) @ np.append(p_base, 1.0)
    uv = K @ (p_cam[:3] / p_cam[2])
    return uv[:2], float(p_cam[2])


@pytest.fixture(scope="module")
def offsets_px(tmp_path_factory):
    """For every (configuration, point): the marker's centroid in the render minus the camera
    file's projection, ``[n, 2]`` pixels. Four renders in one twin."""
    pytest.importorskip("mani_skill", reason="needs the [maniskill] extra: bash scripts/setup.sh maniskill")
    import gymnasium as gym
    import sapien
    import torch

    import vla_envs  # noqa: F401  (registers the env ids)
    from calibration.camera_file import write_camera_file
    from calibration.overlay import capture
    from vla_envs.tasks.put_on_plate.env import PANDA_BASE

    root = tmp_path_factory.mktemp("twin")
    camera_file = write_camera_file(root / "camera.json", intrinsics=Intrinsics(WIDTH, HEIGHT, K),
                                    T_base_from_cam=T_BASE_FROM_CAM)
    env = gym.make("PutOnPlateInScene25Main-v3", num_envs=1, camera_file=str(camera_file),
                   image_size=(HEIGHT, WIDTH), assets="procedural", asset_root=str(root / "assets"),
                   sim_backend="physx_cpu", vectorization="serial")
    try:
        task = env.backend.envs[0]._env.unwrapped
        assert tuple(task.image_hw) == (HEIGHT, WIDTH)
        T_world_from_base = PANDA_BASE.to_transformation_matrix()

        def marker(name):
            builder = task.scene.create_actor_builder()
            builder.add_sphere_visual(radius=MARKER_RADIUS_M,
                                      material=sapien.render.RenderMaterial(base_color=[1.0, 0.0, 1.0, 1.0]))
            builder.initial_pose = sapien.Pose(p=[0.0, 0.0, -5.0])
            return builder.build_kinematic(name=name)

        def hide(entities):
            for entity in entities:
                body = entity.find_component_by_type(sapien.render.RenderBodyComponent)
                if body is not None:
                    body.visibility = 0.0

        hide([link._objs[0].entity for link in task.agent.robot.get_links()])
        hide([obj for actor in task.objects + task.plates for obj in actor._objs])
        tcp_marker = marker("tcp_marker")
        fixed = [marker(f"fixed_marker_{i}") for i in range(len(FIXED_POINTS_BASE))]
        for m, p in zip(fixed, FIXED_POINTS_BASE):
            m.set_pose(sapien.Pose(p=(T_world_from_base @ np.append(p, 1.0))[:3]))
        rest = np.asarray(task.agent.keyframes["rest"].qpos, dtype=np.float32)
        offsets, tcp_px = [], []
        for arm in ARM_QPOS:
            qpos = rest.copy()
            if arm is not None:
                qpos[:7] = arm
            task.agent.robot.set_qpos(torch.as_tensor(qpos[None]))
            tcp_world = task.agent.tcp.pose.p[0].cpu().numpy().astype(np.float64)
            tcp_marker.set_pose(sapien.Pose(p=tcp_world))
            _, segmentation = capture(task)
            tcp_base = (invert(T_world_from_base) @ np.append(tcp_world, 1.0))[:3]
            for m, p_base in [(tcp_marker, tcp_base)] + list(zip(fixed, FIXED_POINTS_BASE)):
                mask = segmentation == m._objs[0].per_scene_id
                uv, depth = project_px(p_base)
                assert 20 < uv[0] < WIDTH - 20 and 20 < uv[1] < HEIGHT - 20, f"{m.name} at {uv} is not in view"
                # a disc of the sphere's projected area: nothing occludes or clips the marker
                expected_px2 = np.pi * (K[0, 0] * MARKER_RADIUS_M / depth) * (K[1, 1] * MARKER_RADIUS_M / depth)
                assert 0.9 * expected_px2 < mask.sum() < 1.4 * expected_px2, (m.name, mask.sum(), expected_px2)
                rows, cols = np.nonzero(mask)
                offsets.append([cols.mean() - uv[0], rows.mean() - uv[1]])
            tcp_px.append(project_px(tcp_base)[0])
    finally:
        env.close()
    spread = np.ptp(np.array(tcp_px), axis=0)
    assert (spread > 40).all(), f"the configurations should move the TCP across the image, spread {spread}"
    return np.array(offsets)


@pytest.mark.maniskill
def test_points_land_within_a_pixel_of_the_camera_files_projection(offsets_px):
    error_px = np.linalg.norm(offsets_px, axis=1)
    assert len(error_px) == len(ARM_QPOS) * (1 + len(FIXED_POINTS_BASE))
    assert error_px.max() < 1.0, f"projection error {error_px.round(3).tolist()} px"


@pytest.mark.maniskill
def test_points_land_on_the_camera_files_projection_without_a_half_pixel_shift(offsets_px):
    """SAPIEN puts pixel centres at +0.5, OpenCV (the camera file) at integers: the twin passes the
    renderer ``render_intrinsic_for``; without it every point lands 0.5 px up and left."""
    mean_px = offsets_px.mean(axis=0)
    assert np.abs(mean_px).max() < 0.15, f"mean offset {mean_px.round(3).tolist()} px"
    assert np.linalg.norm(offsets_px - mean_px, axis=1).max() < 0.25
