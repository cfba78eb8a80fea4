"""The person at the robot: resets the scene before each episode and says how it ended.

A real cell has no success detector; the operator marks success or failure (``franka-eval``
reads it from the keyboard). ``ScriptedOperator`` stands in where nobody is at the keyboard
(dry runs, tests, a simulated arm).
"""

from __future__ import annotations

import select
import sys
from typing import Protocol, TextIO

LABELS = ("success", "failure")


class Operator(Protocol):
    def wait_for_reset(self, instruction: str) -> None:
        """Block until the scene is set up for an episode of ``instruction``."""

    def poll_label(self) -> str | None:
        """``"success"``, ``"failure"`` when the operator ended the episode, else None. Never blocks."""


class KeyboardOperator:
    """Reads the operator's keys from a terminal: Enter starts an episode; ``s`` + Enter marks
    success, ``f`` + Enter failure (the episode then ends at once; otherwise at the time limit)."""

    def __init__(self, stdin: TextIO | None = None, stdout: TextIO | None = None):
        self.stdin, self.stdout = stdin or sys.stdin, stdout or sys.stdout

    def wait_for_reset(self, instruction: str) -> None:
        print(f"\nSet up the scene for: {instruction!r}. The arm moves home first. Press Enter to start "
              "(during the episode: s + Enter = success, f + Enter = failure).", file=self.stdout, flush=True)
        if not self.stdin.readline():
            raise EOFError("the operator's input closed; franka-eval needs a terminal (or --operator scripted)")

    def poll_label(self) -> str | None:
        ready, _, _ = select.select([self.stdin], [], [], 0.0)
        if not ready:
            return None
        key = self.stdin.readline().strip().lower()[:1]
        return {"s": "success", "f": "failure"}.get(key)


class ScriptedOperator:
    """Resets at once and labels nothing (episodes run to the time limit), or labels every
    episode ``label`` after ``after_steps`` steps."""

    def __init__(self, label: str | None = None, after_steps: int = 0):
        if label is not None and label not in LABELS:
            raise ValueError(f"label={label!r}; allowed: {LABELS} or None")
        self.label, self.after_steps, self._steps = label, after_steps, 0

    def wait_for_reset(self, instruction: str) -> None:
        self._steps = 0

    def poll_label(self) -> str | None:
        self._steps += 1
        return self.label if self.label is not None and self._steps >= self.after_steps else None
