"""Checkpoints: atomic writes, model folders and resumable training state.

``atomic`` (folder and text writes) and ``layout`` (where a run keeps its checkpoints) <-
``model_io`` (save / resolve / publish a model folder) <- ``train_state`` (training
checkpoints, the resume fingerprint, RNG state).
"""

from .atomic import remove_leftovers, write_atomic_dir, write_text_atomic
from .layout import KEEP_CHECKPOINTS, checkpoint_name, latest_checkpoint, run_folder_lock
from .model_io import (
    TRAINING_RECORDS,
    check_model_out_dir,
    checkpoint_recipe,
    export_merged,
    publish_half_precision,
    recorded_unnorm_key,
    resolve_model_dir,
    save_model,
)
from .train_state import (
    RESUMABLE_CHANGES,
    CheckpointWriteError,
    check_resumable,
    fingerprint,
    fingerprint_hash,
    read_train_state,
    resolve_resume,
    restore_rng,
    rng_state,
    save_train_checkpoint,
    set_aside_newer_checkpoints,
)
