"""PutOnPlateInScene25's options: ``gym.make("PutOnPlateInScene25Main-v3", num_envs=N, **options)``.

Each is checked when the options are made, before any simulator starts. The training-only ones
(``training_only``) change what the policy is measured on; ``gym.make(..., evaluation=True)``
refuses them unless they keep their defaults.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vla_envs.core.options import TaskOptions, training_only

CONTROL_FREQ = 5  # Hz, the reference's
REFERENCE_SIM_FREQ = 500
ROBOTS = ("panda",)
REWARD_MODES = ("dense", "sparse", "none")  # ManiSkill's names; "none": reward 0


@dataclass(kw_only=True, frozen=True)
class PutOnPlateOptions(TaskOptions):
    """What one PutOnPlateInScene25 env is made with (the variant is the env id)."""

    BACKEND_OPTIONS = ("sim_backend", "vectorization", "render_backend")  # as for every ManiSkill env

    assets: Literal["auto", "official", "procedural"] = "auto"
    """Asset pack: ``"official"`` (the Bridge real2sim assets, ``vla-envs fetch-assets``),
    ``"procedural"`` (generated here), ``"auto"`` (official when present, else procedural with a
    warning). See ``assets.resolve_pack``."""
    asset_root: str | Path | None = None
    """Where packs live (None: ``$VLA_ENVS_ASSET_DIR``, default ``~/.vla_envs/assets``)."""
    robot: Literal["panda"] = "panda"
    """Our Franka's twin (WidowX needs the official robot assets, not shipped)."""
    low_poly: bool = False
    """Render the Panda with its collision meshes: 4-8x faster on CPU, and the arm looks
    different, so evaluate a policy with the setting it was trained with."""
    sim_freq: int = training_only("changes the physics (fewer sub-steps per control step)",
                                  default=REFERENCE_SIM_FREQ)
    """Physics steps per second, a multiple of the 5 Hz control rate. 500 (the reference's) takes
    100 sub-steps per control step; 100 takes 20, about 2x the env-steps/s, at some cost in grasp
    fidelity (the scripted expert's success falls from 0.98 to 0.92, ``docs/benchmarks.md``)."""
    camera_file: str | Path | None = None
    """The calibration tool's camera file (None: the packaged one)."""
    image_size: int | tuple[int, int] = (480, 640)
    """The side, or (height, width), of the picture the policy reads (see ``native_render``)."""
    camera_crop: tuple[int, int, int, int] | None = None
    """``(left, top, right, bottom)`` in the camera file's pixels: the policy sees only this region,
    resized to ``image_size`` (None: the whole view). Rendered as a pinhole camera of its own (only
    that region is drawn); the real camera's frames get the same crop."""
    native_render: bool = True
    """Render the camera at its own resolution (the camera file's pixels of ``camera_crop``), lay
    the table photo and the noise there, and resize the picture to ``image_size`` with
    ``vla_envs.core.images.resize_rgb``: what a real camera's frame goes through (``franka/*``)
    and what the reference's image processor does to its 640x480 renders. False: render at
    ``image_size`` directly: faster on CPU at small sizes (a 270 px crop at 64 px: about 1.3x the
    env-steps/s; the whole 640x480 view at 64 px: 2.5x), but the edges are aliased as no camera's
    are, so evaluate a policy with the setting it was trained with."""
    reward_shaping: float = 0.0
    """Weight of a reach-and-place term added to the reference's dense reward
    (``rewards.shaping_potential``, differenced like it): up to this for bringing the gripper to the
    object, as much again for bringing the object to the plate. 0: the reference's reward. Success
    is unchanged."""
    reward_mode: Literal["dense", "sparse", "none"] = "dense"
    """``"dense"``: the reference's staged reward (0.1 for the first grasp, 0.1 for holding it 5
    steps, 1.0 for success), differenced per step. ``"sparse"``: 1 while successful after a grasp.
    ``"none"``: 0. Success is unchanged."""
    expert_start_phases: tuple[str, ...] = training_only(
        "starts episodes where the scripted expert left them", default=())
    """Start each episode where the scripted expert, run from the episode's initial state, enters
    one of these phases (``expert.PHASES``: ``"above"`` is the episode's own start, ``"lift"`` just
    grasped, ``"carry"`` lifted, ``"lower"`` over the plate, ``"open"`` lowered onto it), drawn per
    episode id (so GRPO groups share it); the time limit counts from there. E.g. ``["above",
    "lift", "carry", "lower"]``: a quarter of the episodes each. Empty: every episode starts at its
    initial state. Needs whole-batch resets on the GPU backend (``auto_reset=False``)."""

    def __post_init__(self) -> None:
        from vla_envs.tasks.put_on_plate.assets import PACK_KINDS
        from vla_envs.tasks.put_on_plate.expert import PHASES

        self._need(self.assets in PACK_KINDS, "assets", f"allowed: {list(PACK_KINDS)}")
        self._need(self.robot in ROBOTS, "robot", f"available here: {list(ROBOTS)}")
        self._need(isinstance(self.low_poly, bool), "low_poly", "true or false")
        self._need(isinstance(self.native_render, bool), "native_render", "true or false")
        self._need(not isinstance(self.sim_freq, bool) and isinstance(self.sim_freq, int)
                   and self.sim_freq >= CONTROL_FREQ and self.sim_freq % CONTROL_FREQ == 0, "sim_freq",
                   f"must be a positive multiple of the {CONTROL_FREQ} Hz control frequency, e.g. "
                   f"{REFERENCE_SIM_FREQ} (the reference's) or 100")
        size = (self.image_size,) * 2 if isinstance(self.image_size, int) else self.image_size
        self._need(isinstance(size, (tuple, list)) and len(size) == 2
                   and all(isinstance(s, int) and not isinstance(s, bool) and s >= 1 for s in size),
                   "image_size", "a side in pixels or (height, width), each an integer >= 1")
        self._set("image_size", self.image_size if isinstance(self.image_size, int) else tuple(size))
        self._need(not isinstance(self.reward_shaping, bool) and isinstance(self.reward_shaping, (int, float))
                   and 0 <= self.reward_shaping < float("inf"), "reward_shaping",
                   "must be a number >= 0 (0: the reference's reward, e.g. 0.1: up to 0.1 for the reach and 0.1 "
                   "for the place)")
        self._set("reward_shaping", float(self.reward_shaping))
        self._need(self.reward_mode in REWARD_MODES, "reward_mode", f"must be one of {list(REWARD_MODES)}")
        if self.reward_mode != "dense" and self.reward_shaping:
            raise ValueError(f"reward_shaping={self.reward_shaping!r} with reward_mode={self.reward_mode!r}: the "
                             f"shaping is part of the dense reward; use reward_mode='dense' or reward_shaping=0")
        phases = self.expert_start_phases
        self._need(not isinstance(phases, str) and isinstance(phases, (tuple, list))
                   and all(p in PHASES for p in phases), "expert_start_phases",
                   f"must be a list of the scripted expert's phases {list(PHASES)} (e.g. ['above', 'lift', "
                   f"'carry', 'lower']), or empty")
        self._set("expert_start_phases", tuple(phases))
        if self.camera_crop is not None:  # its bounds are the camera file's: checked when the env is made
            crop = self.camera_crop
            self._need(isinstance(crop, (tuple, list)) and len(crop) == 4
                       and all(isinstance(c, int) and not isinstance(c, bool) and c >= 0 for c in crop)
                       and crop[0] < crop[2] and crop[1] < crop[3], "camera_crop",
                       "(left, top, right, bottom) in pixels, left < right and top < bottom, or None")
            self._set("camera_crop", tuple(crop))

    def check_camera(self) -> None:
        """Reads the camera file and checks the crop against its image (errors name the field)."""
        from vla_envs.camera_file import load_camera_file

        load_camera_file(self.camera_file).check_crop(self.camera_crop)

    @property
    def image_hw(self) -> tuple[int, int]:
        return (self.image_size,) * 2 if isinstance(self.image_size, int) else self.image_size
