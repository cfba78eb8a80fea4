"""Training data below the models: demonstration samples and scene targets (numpy / torch only)."""

from .demos import (
    DemoFolders,
    SFTSamples,
    action_chunks,
    demo_folders,
    build_samples,
    demos_env,
    epoch_pool,
    load_episodes,
    release_chunks,
    resize_images,
    scene_options,
    stack_images,
    state_stats,
    trained_episodes,
)
from .scene import TARGETS_PER_BODY, scene_targets, yaw_of_wxyz
