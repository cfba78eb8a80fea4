"""Rendered views of the board with known poses: a ground truth for tests and the self-test.

The board is planar, so its image under a pinhole camera is a homography of the board's own
picture: ``K [r1 r2 t]`` maps board coordinates (metres, z = 0) to pixels. The renderer warps
the board picture at 3x the camera's resolution and averages 3x3 blocks (anti-aliasing, as a
real sensor integrates light over a pixel), then adds Gaussian noise. No lens distortion.

Scenes put the camera and the board where they are in real setups, and sample robot poses
that keep the whole board in view and rotate it diversely:

* ``side``: eye-to-hand, the camera beside and above the workspace looking at the robot
  (like the twin's default camera), board on the flange.
* ``overhead``: eye-to-hand, the camera above the table looking down, its rotation from the
  base about 180 degrees (where OpenCV's default TSAI solver fails).
* ``wrist``: eye-in-hand, the camera on the flange, the board lying on the table.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from calibration.board import BoardSpec, board_image
from calibration.hand_eye import Mode
from calibration.intrinsics import Intrinsics
from calibration.transforms import invert, make_transform, rotvec_to_matrix


def look_at(eye, target, up=(0.0, 0.0, 1.0)) -> np.ndarray:
    """``T_base_from_cam`` of a camera at ``eye`` looking at ``target`` (OpenCV axes: z forward,
    x right, y down; ``up`` is the base direction that appears up in the image)."""
    eye, target, up = (np.asarray(v, dtype=float) for v in (eye, target, up))
    z = target - eye
    z /= np.linalg.norm(z)
    x = np.cross(z, up)
    x /= np.linalg.norm(x)
    return make_transform(np.column_stack([x, np.cross(z, x), z]), eye)


def default_intrinsics(width: int = 640, height: int = 480) -> Intrinsics:
    """A RealSense D435-like color camera at 640x480 (off-centre principal point on purpose)."""
    K = np.array([[615.0 * width / 640, 0.0, 0.5 * width + 3.7], [0.0, 615.0 * width / 640, 0.5 * height - 2.9],
                  [0.0, 0.0, 1.0]])
    return Intrinsics(width, height, K, np.zeros(5))


class BoardRenderer:
    """Renders one board into camera images."""

    def __init__(self, spec: BoardSpec, px_per_square: int = 64, quiet_zone_squares: float = 0.5,
                 black: int = 25, white: int = 230):
        """
        Args:
            spec: the board.
            px_per_square: resolution of the board picture (about the supersampled camera's
                at 0.4-0.8 m; finer adds no detail).
            quiet_zone_squares: white margin around the board, in squares (printed boards have one).
            black, white: gray levels of the ink and the paper (a real image never spans 0-255).
        """
        self.spec = spec
        self.px_per_square = px_per_square
        pad = int(round(quiet_zone_squares * px_per_square))
        picture = np.pad(board_image(spec, px_per_square), pad, constant_values=255).astype(np.float32)
        self.picture = (black + picture * ((white - black) / 255.0)).astype(np.uint8)
        m_per_px = spec.square_length_m / px_per_square
        # picture pixel centre (u, v) -> board (x, y, 1): pixel u covers [u - pad, u - pad + 1) * m_per_px
        self._board_from_picture = np.array([[m_per_px, 0.0, (0.5 - pad) * m_per_px],
                                             [0.0, m_per_px, (0.5 - pad) * m_per_px], [0.0, 0.0, 1.0]])

    def render(self, T_cam_from_board: np.ndarray, intrinsics: Intrinsics, rng: np.random.Generator | None = None,
               noise_std: float = 1.5, background: int = 105, supersample: int = 3) -> np.ndarray:
        """The camera's 8-bit gray image of the board at ``T_cam_from_board``.

        Args:
            T_cam_from_board: the board's pose in the camera (board in front: z > 0).
            intrinsics: the camera (its distortion is ignored).
            rng: for the noise; None for a noise-free image.
            noise_std: Gaussian pixel noise, gray levels.
            background: gray level around the board.
            supersample: render at this factor and average blocks (anti-aliasing).
        """
        import cv2

        K = intrinsics.camera_matrix
        H_cam_from_board = K @ np.column_stack([T_cam_from_board[:3, 0], T_cam_from_board[:3, 1],
                                                T_cam_from_board[:3, 3]])
        s = supersample
        # camera pixel centre u <-> supersampled pixel centre s*u + (s-1)/2
        S = np.array([[s, 0.0, (s - 1) / 2.0], [0.0, s, (s - 1) / 2.0], [0.0, 0.0, 1.0]])
        H = S @ H_cam_from_board @ self._board_from_picture
        big = cv2.warpPerspective(self.picture, H, (intrinsics.width * s, intrinsics.height * s),
                                  flags=cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT, borderValue=background)
        image = cv2.resize(big, (intrinsics.width, intrinsics.height), interpolation=cv2.INTER_AREA)
        if rng is None or noise_std <= 0:
            return image
        noisy = image.astype(np.float32) + rng.normal(0.0, noise_std, image.shape).astype(np.float32)
        return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


def board_outline_px(spec: BoardSpec, T_cam_from_board: np.ndarray, intrinsics: Intrinsics) -> np.ndarray:
    """The board's four outer corners projected into the image, ``[4, 2]`` pixels (inf behind)."""
    corners = np.array([[0, 0, 0], [spec.width_m, 0, 0], [spec.width_m, spec.height_m, 0], [0, spec.height_m, 0]])
    p = corners @ T_cam_from_board[:3, :3].T + T_cam_from_board[:3, 3]
    with np.errstate(divide="ignore", invalid="ignore"):
        uv = (p @ intrinsics.camera_matrix.T)[:, :2] / p[:, 2:3]
    uv[p[:, 2] <= 0.05] = np.inf
    return uv


def sample_board_pose(rng: np.random.Generator, spec: BoardSpec, intrinsics: Intrinsics,
                      depth_range_m: tuple[float, float] = (0.45, 0.8), max_tilt_deg: float = 35.0,
                      max_roll_deg: float = 60.0, margin_px: float = 15.0, max_tries: int = 1000) -> np.ndarray:
    """A random ``T_cam_from_board`` with the whole board in view.

    The board faces the camera, tilted by up to ``max_tilt_deg`` about a random axis in the
    image plane and rolled by up to ``max_roll_deg`` about its normal; its centre is at a
    random depth in ``depth_range_m`` and a random pixel.
    """
    W, H = intrinsics.width, intrinsics.height
    K_inv = np.linalg.inv(intrinsics.camera_matrix)
    for _ in range(max_tries):
        axis_angle = rng.uniform(0, 2 * np.pi)
        tilt = np.radians(rng.uniform(0, max_tilt_deg)) * np.array([np.cos(axis_angle), np.sin(axis_angle), 0.0])
        roll = np.radians(rng.uniform(-max_roll_deg, max_roll_deg)) * np.array([0.0, 0.0, 1.0])
        R = rotvec_to_matrix(tilt) @ rotvec_to_matrix(roll)
        pixel = np.array([rng.uniform(0.25, 0.75) * W, rng.uniform(0.25, 0.75) * H, 1.0])
        centre_cam = K_inv @ pixel * rng.uniform(*depth_range_m)
        T = make_transform(R, centre_cam - R @ spec.center_m)
        uv = board_outline_px(spec, T, intrinsics)
        if np.isfinite(uv).all() and (uv.min(axis=0) >= margin_px).all() and \
                (uv[:, 0].max() <= W - 1 - margin_px) and (uv[:, 1].max() <= H - 1 - margin_px):
            return T
    raise RuntimeError(f"no board pose in view after {max_tries} tries: the board is too large for the image "
                       f"at depths {depth_range_m} m")


@dataclass(frozen=True)
class Scene:
    """A calibration setup with its ground truth."""

    name: str
    mode: Mode
    T_cam: np.ndarray
    """The truth: ``T_base_from_cam`` (eye-to-hand) or ``T_ee_from_cam`` (eye-in-hand)."""
    T_board: np.ndarray
    """``T_ee_from_board`` (eye-to-hand) or ``T_base_from_board`` (eye-in-hand)."""
    spec: BoardSpec = field(default_factory=BoardSpec)
    intrinsics: Intrinsics = field(default_factory=default_intrinsics)
    depth_range_m: tuple[float, float] = (0.45, 0.8)

    def robot_pose(self, T_cam_from_board: np.ndarray) -> np.ndarray:
        """``T_base_from_ee`` that puts the board at ``T_cam_from_board``."""
        if self.mode is Mode.EYE_TO_HAND:
            return self.T_cam @ T_cam_from_board @ invert(self.T_board)
        return self.T_board @ invert(T_cam_from_board) @ invert(self.T_cam)

    def sample(self, rng: np.random.Generator, n: int, robot_noise_mm: float = 0.0, robot_noise_deg: float = 0.0
               ) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """``n`` samples: (robot poses ``T_base_from_ee``, true ``T_cam_from_board``). Robot
        poses get Gaussian noise per axis (a robot's absolute accuracy) if asked."""
        boards = [sample_board_pose(rng, self.spec, self.intrinsics, self.depth_range_m) for _ in range(n)]
        robots = []
        for T in boards:
            T_robot = self.robot_pose(T)
            if robot_noise_mm or robot_noise_deg:
                noise = make_transform(rotvec_to_matrix(np.radians(rng.normal(0, robot_noise_deg, 3))),
                                       rng.normal(0, robot_noise_mm / 1000.0, 3))
                T_robot = T_robot @ noise
            robots.append(T_robot)
        return robots, boards


def make_scene(name: str, spec: BoardSpec | None = None) -> Scene:
    """One of the scenes of the module doc: ``side``, ``overhead`` or ``wrist``."""
    spec = spec or BoardSpec()
    if name == "side":
        # camera ~1.1 m from the base, beside and above the table; board 3 cm out of the
        # flange, facing along the flange's z (the viewer looks along -z_ee)
        T_cam = look_at([1.05, -0.45, 0.60], [0.45, 0.0, 0.20])
        T_board = make_transform(rotvec_to_matrix([np.pi, 0.0, 0.0]), [0.0, 0.0, 0.03]) @ \
            make_transform(np.eye(3), -spec.center_m)
        return Scene(name, Mode.EYE_TO_HAND, T_cam, T_board, spec)
    if name == "overhead":
        # camera 1.25 m above the table looking down, image x along -x of the base: a rotation
        # of 180 degrees about y, tilted 2 degrees; board on a bracket facing -x_ee
        R = rotvec_to_matrix([0.0, np.pi, 0.0]) @ rotvec_to_matrix(np.radians([1.5, 0.0, 1.3]))
        T_cam = make_transform(R, [0.50, 0.02, 1.25])
        R_board = np.column_stack([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
        T_board = make_transform(R_board, [-0.02, 0.0, 0.10]) @ make_transform(np.eye(3), -spec.center_m)
        return Scene(name, Mode.EYE_TO_HAND, T_cam, T_board, spec)
    if name == "wrist":
        # camera 6 cm off the flange axis looking along it; board lying on the table face up
        T_cam = make_transform(rotvec_to_matrix([0.0, 0.0, np.pi / 2]), [0.06, 0.0, 0.04])
        T_board = make_transform(rotvec_to_matrix([np.pi, 0.0, 0.0]), [0.45, 0.10, 0.0])
        return Scene(name, Mode.EYE_IN_HAND, T_cam, T_board, spec, depth_range_m=(0.35, 0.6))
    raise ValueError(f"scene {name!r} is not defined; allowed: side, overhead, wrist")


def write_synthetic_session(folder: str | Path, scene: Scene, rng: np.random.Generator, n: int = 15,
                            noise_std: float = 1.5, robot_noise_mm: float = 0.0, robot_noise_deg: float = 0.0,
                            blank: tuple[int, ...] = ()) -> list[np.ndarray]:
    """Render a session folder of ``scene`` (``session.py``'s format).

    Args:
        folder: a new folder.
        scene: the setup.
        rng: randomness of poses and noise.
        n: samples.
        noise_std: image noise, gray levels.
        robot_noise_mm, robot_noise_deg: robot pose noise.
        blank: sample indices whose image shows no board (to test the errors).

    Returns:
        The true ``T_cam_from_board`` of each sample.
    """
    from calibration.session import SessionSpec, add_sample, create_session

    create_session(folder, SessionSpec(mode=scene.mode, board=scene.spec, intrinsics=scene.intrinsics))
    robots, boards = scene.sample(rng, n, robot_noise_mm, robot_noise_deg)
    renderer = BoardRenderer(scene.spec)
    for i, (T_robot, T_board) in enumerate(zip(robots, boards)):
        image = renderer.render(T_board, scene.intrinsics, rng, noise_std)
        if i in blank:
            image[:] = 105
        add_sample(folder, i, image, T_robot)
    return boards
