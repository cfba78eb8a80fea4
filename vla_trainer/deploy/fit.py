"""Whether a checkpoint fits the real Franka env: the one check ``franka-eval`` and the ROS policy
node make before anything moves (image size, camera crop, state layout, action convention)."""

from __future__ import annotations


class CheckpointMismatchError(ValueError):
    """The checkpoint expects another env than the one configured; the message names both sides."""


def check_fit(spec, *, image_size: int | None, camera_crop: tuple[int, int, int, int] | None,
              state_dim: int, action_dim: int = 7,
              camera_hw: tuple[int, int] | None = None) -> tuple[int, tuple[int, int, int, int] | None]:
    """The image size and camera crop to run with, after checking the policy against the env.

    Args:
        spec: ``vla_trainer.deploy.serve.PolicySpec`` of the checkpoint.
        image_size: asked for (``--image-size``; None: the checkpoint's).
        camera_crop: asked for (``--camera-crop``, the policy node's ``camera_crop``; None: the
            checkpoint's, if it records one).
        state_dim: the env's ``state`` width.
        camera_hw: (height, width) of the env's camera file: a crop counts pixels of the training
            camera's images, and means another part of the view in images of another size.

    Raises:
        CheckpointMismatchError: naming the quantity, the checkpoint's value and the env's.
    """
    from vla_envs.registry import TASKS

    if image_size is not None and image_size != spec.image_size:
        raise CheckpointMismatchError(f"image size: the checkpoint reads {spec.image_size} px images, "
                                      f"{image_size} px were asked for")
    if spec.state_dim not in (0, state_dim):
        raise CheckpointMismatchError(f"state: the checkpoint reads a {spec.state_dim}-wide state, the real Franka "
                                      f"env gives the twin's {state_dim} (7 joints, 2 fingers, TCP xyz + wxyz)")
    if spec.action_dim != action_dim:
        raise CheckpointMismatchError(f"actions: the checkpoint predicts {spec.action_dim}-D actions, the env takes "
                                      f"{action_dim}-D (delta xyz, delta rotation, gripper)")
    if spec.task is not None and (trained := TASKS.get(spec.task)) is not None and trained.backend == "libero":
        raise CheckpointMismatchError(f"actions: the checkpoint was trained on {spec.task}, whose actions are LIBERO's "
                                      f"(robosuite's OSC controller: another scale and frame); the real Franka env "
                                      f"takes the Panda twin's pd_ee_delta_pose actions (a ManiSkill task such as "
                                      f"PutOnPlateInScene25Main-v3)")
    crop = camera_crop if camera_crop is not None else spec.camera_crop
    if camera_crop is not None and spec.camera_crop is not None and tuple(camera_crop) != tuple(spec.camera_crop):
        raise CheckpointMismatchError(f"camera crop: the checkpoint was trained on crop {tuple(spec.camera_crop)}, "
                                      f"crop {tuple(camera_crop)} was asked for")
    if camera_hw is not None and (why := spec.crop_mismatch(crop, camera_hw)):
        raise CheckpointMismatchError(why)
    return spec.image_size, crop
