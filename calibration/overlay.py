"""The overlay check: the twin's view through the camera file, drawn over a real camera frame.

The end-to-end test of a calibration. The Panda twin is rendered from the camera file (the
same code path the policy's images come from, without the table-photo green screen), with the
robot at the joint configuration of the real picture, and blended with the real frame:

* ``edges``: the outlines of the twin's robot and table in a bright colour over the real image;
* ``alpha``: the twin's picture and the real one, 50/50.

Given a mask of the robot in the real frame (``--real-mask``: any tool, or by hand), the twin's
robot silhouette (its segmentation) is compared with it: the offset of the two masks' centroids
(``offset_px``, real minus twin, image x right and y down) and their intersection over union.

ManiSkill is imported only when rendering; OpenCV only where images are read or drawn.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from calibration.files import write_json_atomic

OVERLAY_FORMAT = "vla-overlay-report-v1"
MODES = ("edges", "alpha")
EDGE_BGR = (0, 255, 0)  # bright green: rare in a lab scene
TASK_ID = "VLA-PutOnPlateInScene25-v1"
NUM_ARM_JOINTS = 7


class TwinUnavailableError(ImportError):
    """The twin cannot be rendered here (ManiSkill, SAPIEN or a Vulkan device is missing)."""


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of a file's bytes, hex (names a camera file's exact version)."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True, eq=False)
class TwinView:
    """One render of the twin through the camera file."""

    rgb: np.ndarray
    """The twin's picture, uint8 ``[H, W, 3]`` RGB (plain table, no green screen)."""
    robot_mask: np.ndarray
    """bool ``[H, W]``: pixels of the robot (any link)."""
    edges: np.ndarray
    """bool ``[H, W]``: outlines of the robot's links and the table (segmentation boundaries)."""
    qpos: np.ndarray
    """The robot's joint positions, ``[9]`` (7 arm joints, 2 fingers; radians, metres)."""


def segmentation_edges(segmentation: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """Pixels on a boundary between two segmentation ids, where one side is in ``ids``.

    Both pixels of each boundary pair are marked, so a line is two pixels wide.

    Args:
        segmentation: int ``[H, W]`` per-pixel ids.
        ids: the ids whose outlines are drawn.

    Returns:
        bool ``[H, W]``.
    """
    seg = np.asarray(segmentation)
    mine = np.isin(seg, ids)
    edges = np.zeros(seg.shape, dtype=bool)
    for axis in (0, 1):
        a = [slice(None), slice(None)]
        b = [slice(None), slice(None)]
        a[axis], b[axis] = slice(None, -1), slice(1, None)
        a, b = tuple(a), tuple(b)
        boundary = (seg[a] != seg[b]) & (mine[a] | mine[b])
        edges[a] |= boundary
        edges[b] |= boundary
    return edges


class TwinRenderer:
    """The Panda twin's main camera, placed by a camera file, rendering one robot configuration
    at a time (CPU PhysX; no physics step: the robot is set exactly to the asked joints).

    Args:
        camera_file: the ``vla-camera-v1`` file.
        camera_crop: ``(left, top, right, bottom)`` in the file's pixels: render only that region,
            at its own size (None: the whole image at the file's resolution).
        assets: the PutOnPlate asset pack to build the scene with (its objects are hidden; only
            the robot and the table are drawn, so the small procedural pack is the default).
        asset_root: where packs live (default ``$VLA_ENVS_ASSET_DIR``).

    Raises:
        TwinUnavailableError: naming ``bash scripts/setup.sh maniskill`` if ManiSkill is missing.
        ValueError: a bad camera file or crop (named).

    Example:
        >>> with TwinRenderer("calib/camera.json") as twin:   # doctest: +SKIP
        ...     view = twin.render(qpos=[0, 0.39, 0, -1.96, 0, 2.36, 0.79])
    """

    def __init__(self, camera_file: str | Path, camera_crop: tuple[int, int, int, int] | None = None, *,
                 assets: str = "procedural", asset_root: str | Path | None = None):
        from vla_envs.camera_file import load_camera_file

        self.camera = load_camera_file(camera_file)
        left, top, right, bottom = self.camera.check_crop(camera_crop)
        self.camera_crop = None if camera_crop is None else (left, top, right, bottom)
        self.image_hw = (bottom - top, right - left)
        try:
            from vla_envs.backends.maniskill.common import import_maniskill, make_maniskill_env

            import_maniskill()
        except ImportError as e:
            raise TwinUnavailableError(f"the overlay renders the twin with ManiSkill, which is not usable here "
                                       f"({e}); install it with: bash scripts/setup.sh maniskill") from e
        from vla_envs.tasks.put_on_plate.assets import resolve_pack

        pack = resolve_pack(assets, Path(asset_root) if asset_root is not None else None)
        try:
            self._env = make_maniskill_env(
                TASK_ID, 1, "physx_cpu", None, "none", obs_mode="rgb+segmentation",
                register_module="vla_envs.tasks.put_on_plate.env", pack=pack, camera_file=str(self.camera.path),
                camera_hw=self.image_hw, camera_crop=self.camera_crop, robot_uids="panda")
        except ImportError as e:  # no Vulkan device for SAPIEN's renderer: the message says how to get one
            raise TwinUnavailableError(f"the twin cannot be rendered here: {e}") from e
        self._env.reset(options={"episode_id": [0]})
        task = self._env.unwrapped
        self._task = task
        self.robot_ids = np.array([link._objs[0].entity.per_scene_id for link in task.agent.robot.get_links()])
        self.table_id = int(task.table._objs[0].per_scene_id)
        # the episode's object and plate stand at positions unrelated to the real scene: hide every model
        for actor in task.objects + task.plates:
            for obj in actor._objs:
                render_body = _render_body(obj)
                if render_body is not None:
                    render_body.visibility = 0.0
        self.default_qpos = np.asarray(task.agent.keyframes["rest"].qpos, dtype=np.float64)
        limits = task.agent.robot.get_qlimits()
        self.qlimits = np.asarray(limits[0] if limits.ndim == 3 else limits, dtype=np.float64)
        self.joint_names = [j.name for j in task.agent.robot.get_active_joints()]

    def check_qpos(self, qpos) -> np.ndarray:
        """``qpos`` as the robot's 9 joint values: 7 arm joints (radians; the fingers stay as in
        the twin's rest pose) or all 9.

        Raises:
            ValueError: naming ``qpos`` and the joint, if the count is wrong, a value is not finite
                or outside the joint's limits.
        """
        q = np.asarray(qpos, dtype=np.float64).ravel()
        if q.size == NUM_ARM_JOINTS:
            q = np.concatenate([q, self.default_qpos[NUM_ARM_JOINTS:]])
        if q.size != self.default_qpos.size or not np.isfinite(q).all():
            raise ValueError(f"qpos must be {NUM_ARM_JOINTS} finite joint angles in radians (the arm's joints 1-7, "
                             f"as the real robot reports them), got {np.asarray(qpos).ravel().tolist()}")
        for i, (value, (low, high)) in enumerate(zip(q, self.qlimits)):
            if not low - 1e-6 <= value <= high + 1e-6:
                raise ValueError(f"qpos: joint {i + 1} ({self.joint_names[i]}) is {value:.4f}, outside its limits "
                                 f"[{low:.4f}, {high:.4f}] (values are radians)")
        return q

    def render(self, qpos=None) -> TwinView:
        """Render the twin with the robot at ``qpos`` (see ``check_qpos``; None: the rest pose)."""
        import torch

        q = self.default_qpos.copy() if qpos is None else self.check_qpos(qpos)
        robot = self._task.agent.robot
        robot.set_qpos(torch.as_tensor(q[None], dtype=torch.float32))
        robot.set_qvel(torch.zeros(1, q.size))
        rgb, segmentation = capture(self._task)
        return TwinView(rgb=rgb, robot_mask=np.isin(segmentation, self.robot_ids),
                        edges=segmentation_edges(segmentation, np.append(self.robot_ids, self.table_id)), qpos=q)

    def close(self) -> None:
        """Release the simulator."""
        if self._env is not None:
            self._env.close()
            self._env = None

    def __enter__(self) -> TwinRenderer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _render_body(obj):
    """The SAPIEN render body of an actor's entity or a link's (None if it has no visual)."""
    import sapien

    entity = getattr(obj, "entity", obj)  # an actor holds entities, a link its physx component
    return entity.find_component_by_type(sapien.render.RenderBodyComponent)


def capture(task) -> tuple[np.ndarray, np.ndarray]:
    """The main camera's raw picture and segmentation of a (single-env) PutOnPlate task:
    uint8 ``[H, W, 3]`` RGB and int ``[H, W]`` per-pixel entity ids. Raw: the task's own
    observation replaces the background by a table photo; this does not."""
    from vla_envs.tasks.put_on_plate.env import CAMERA_UID

    task.scene.update_render(update_sensors=True, update_human_render_cameras=False)
    camera = task.scene.sensors[CAMERA_UID]
    camera.capture()
    images = camera.get_obs(rgb=True, depth=False, position=False, segmentation=True)
    rgb = images["rgb"][0, ..., :3].cpu().numpy().astype(np.uint8)
    segmentation = images["segmentation"][0, ..., 0].cpu().numpy().astype(np.int64)
    return rgb, segmentation


# ---------------------------------------------------------------------------------- comparison
@dataclass(frozen=True)
class SilhouetteOffset:
    """How the real robot's mask sits relative to the twin's."""

    dx_px: float
    """Centroid of the real mask minus the twin's, image x (right), pixels."""
    dy_px: float
    """The same along image y (down), pixels."""
    iou: float
    """Intersection over union of the two masks, 0..1."""

    @property
    def offset_px(self) -> float:
        """Length of the centroid offset, pixels."""
        return float(np.hypot(self.dx_px, self.dy_px))


def mask_centroid_px(mask: np.ndarray) -> np.ndarray:
    """``(x, y)`` centroid of a bool mask, pixels (pixel centres at integers, as OpenCV's)."""
    rows, cols = np.nonzero(mask)
    return np.array([cols.mean(), rows.mean()])


def silhouette_offset(twin_mask: np.ndarray, real_mask: np.ndarray) -> SilhouetteOffset:
    """Compare the twin's robot mask with the real one.

    Args:
        twin_mask: bool ``[H, W]``, the twin's robot.
        real_mask: bool ``[H, W]``, the robot in the real frame.

    Raises:
        ValueError: if the shapes differ or a mask is empty (named).
    """
    twin_mask, real_mask = np.asarray(twin_mask, dtype=bool), np.asarray(real_mask, dtype=bool)
    if twin_mask.shape != real_mask.shape:
        raise ValueError(f"the real mask is {real_mask.shape[1]}x{real_mask.shape[0]} but the twin's render is "
                         f"{twin_mask.shape[1]}x{twin_mask.shape[0]}; they must be the same size")
    if not real_mask.any():
        raise ValueError("the real mask has no robot pixels (robot = pixels above 127)")
    if not twin_mask.any():
        raise ValueError("the twin's robot is not in view: check the camera file's pose and the joint positions")
    dx, dy = mask_centroid_px(real_mask) - mask_centroid_px(twin_mask)
    iou = float((twin_mask & real_mask).sum() / (twin_mask | real_mask).sum())
    return SilhouetteOffset(float(dx), float(dy), iou)


def blend(real_bgr: np.ndarray, view: TwinView, mode: str = "edges") -> np.ndarray:
    """The overlay picture, uint8 ``[H, W, 3]`` BGR.

    Args:
        real_bgr: the real frame, uint8 ``[H, W, 3]`` BGR (as ``cv2.imread`` gives it).
        view: the twin's render of the same size.
        mode: ``"edges"`` (the twin's outlines in bright green over the real image) or
            ``"alpha"`` (50/50).

    Raises:
        ValueError: an unknown mode, or images of different sizes.
    """
    if mode not in MODES:
        raise ValueError(f"mode {mode!r} is not known; allowed: {', '.join(MODES)}")
    if real_bgr.shape[:2] != view.rgb.shape[:2]:
        raise ValueError(f"the real image is {real_bgr.shape[1]}x{real_bgr.shape[0]} but the twin's render is "
                         f"{view.rgb.shape[1]}x{view.rgb.shape[0]}")
    twin_bgr = view.rgb[..., ::-1]
    if mode == "alpha":
        return ((real_bgr.astype(np.uint16) + twin_bgr.astype(np.uint16) + 1) // 2).astype(np.uint8)
    out = real_bgr.copy()
    out[view.edges] = EDGE_BGR
    return out


# ---------------------------------------------------------------------------------- files
def fit_to_view(image: np.ndarray, camera, crop: tuple[int, int, int, int] | None, what: str) -> np.ndarray:
    """A real picture (or mask) as the twin sees it: the full frame at the camera file's
    resolution, undistorted when the file records lens distortion (as the policy's frames are),
    cropped to ``crop``; or a picture already cropped to it (of a camera without distortion).

    Raises:
        ValueError: naming ``what`` and the sizes allowed.
    """
    h, w = image.shape[:2]
    left, top, right, bottom = camera.check_crop(crop)
    undistort = camera.undistorter()
    if (w, h) == (camera.width, camera.height):
        return (image if undistort is None else undistort(image))[top:bottom, left:right]
    if crop is not None and (w, h) == (right - left, bottom - top):
        if undistort is not None:
            raise ValueError(f"{what} is cropped, but {camera.path} records lens distortion, which is undone on "
                             f"the full frame: give the {camera.width}x{camera.height} frame")
        return image
    allowed = f"{camera.width}x{camera.height} (the camera file's resolution)"
    if crop is not None:
        allowed += f" or {right - left}x{bottom - top} (the crop {tuple(crop)} already applied)"
    raise ValueError(f"{what} is {w}x{h}; allowed: {allowed}")


@dataclass(frozen=True)
class OverlayReport:
    """What ``vla-calibrate overlay`` measured; ``to_dict`` is the JSON written beside the PNG."""

    image: str
    camera_file: str
    camera_file_sha256: str
    mode: str
    qpos: list[float]
    camera_crop: list[int] | None
    size_px: list[int]
    twin_robot_pixels: int
    real_mask: str | None = None
    offset: SilhouetteOffset | None = None

    def to_dict(self) -> dict:
        data = {"format": OVERLAY_FORMAT, "image": self.image, "camera_file": self.camera_file,
                "camera_file_sha256": self.camera_file_sha256, "mode": self.mode,
                "qpos": [round(v, 6) for v in self.qpos], "camera_crop": self.camera_crop, "size_px": self.size_px,
                "twin_robot_pixels": self.twin_robot_pixels, "real_mask": self.real_mask,
                "offset_px": None, "offset_norm_px": None, "iou": None}
        if self.offset is not None:
            data.update(offset_px=[round(self.offset.dx_px, 3), round(self.offset.dy_px, 3)],
                        offset_norm_px=round(self.offset.offset_px, 3), iou=round(self.offset.iou, 4))
        return data

    def summary(self) -> str:
        arm = ", ".join(f"{v:.3f}" for v in self.qpos[:NUM_ARM_JOINTS])
        lines = [f"twin rendered from {self.camera_file} at {self.size_px[0]}x{self.size_px[1]}, robot at qpos "
                 f"[{arm}]: {self.twin_robot_pixels} robot pixels"]
        if self.offset is not None:
            o = self.offset
            lines.append(f"robot silhouette: real minus twin centroid ({o.dx_px:+.2f}, {o.dy_px:+.2f}) px "
                         f"= {o.offset_px:.2f} px, IoU {o.iou:.3f}")
        return "\n".join(lines)


def read_image(path: str | Path, what: str, gray: bool = False) -> np.ndarray:
    """An 8-bit image from disk (BGR, or gray with ``gray``).

    Raises:
        ValueError: naming ``what`` if it cannot be read as an image.
    """
    import cv2

    image = cv2.imread(str(path), cv2.IMREAD_GRAYSCALE if gray else cv2.IMREAD_COLOR)
    if image is None:
        raise ValueError(f"{what} {path} cannot be read as an image (PNG, JPEG, ...)")
    return image


def write_overlay(out: str | Path, real_bgr: np.ndarray, view: TwinView, *, mode: str, image: str,
                  camera_file: Path, camera_crop, real_mask: np.ndarray | None = None,
                  real_mask_name: str | None = None) -> OverlayReport:
    """Blend, compare and write ``out`` (PNG) and the report beside it (``out`` with ``.json``).

    Args:
        out: the PNG to write.
        real_bgr: the real frame, already fitted to the view (``fit_to_view``).
        view: the twin's render.
        mode: ``"edges"`` or ``"alpha"``.
        image, real_mask_name: names recorded in the report.
        camera_file: the camera file rendered from.
        camera_crop: the crop rendered, or None.
        real_mask: bool mask of the real robot (fitted like ``real_bgr``), or None.

    Returns:
        The report written.
    """
    import cv2

    picture = blend(real_bgr, view, mode)
    offset = silhouette_offset(view.robot_mask, real_mask) if real_mask is not None else None
    report = OverlayReport(image=image, camera_file=str(camera_file), camera_file_sha256=file_sha256(camera_file),
                           mode=mode, qpos=[float(v) for v in view.qpos],
                           camera_crop=None if camera_crop is None else [int(v) for v in camera_crop],
                           size_px=[int(view.rgb.shape[1]), int(view.rgb.shape[0])],
                           twin_robot_pixels=int(view.robot_mask.sum()), real_mask=real_mask_name, offset=offset)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    if not cv2.imwrite(str(out), picture):
        raise ValueError(f"could not write {out} (the name must end in .png)")
    write_json_atomic(out.with_suffix(".json"), report.to_dict())
    return report
