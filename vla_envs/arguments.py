"""argparse types shared by every command line of the project (``vla-envs``, ``vla-train``,
``vla-eval``, ``vla-serve``, ``franka-eval``, ``vla-calibrate``): a malformed value is refused by argparse with the
flag named and exit status 2, before any work starts."""

from __future__ import annotations

import argparse
import json
import math


def int_at_least(minimum: int):
    """An argparse type: a whole number >= ``minimum``."""
    expected = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
        return value
    return parse


positive_int = int_at_least(1)
"""A whole number >= 1 (counts: envs, episodes, steps, pixels)."""


def positive_float(text: str) -> float:
    """A finite number > 0 (temperatures, rates, lengths)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"expected a positive finite number, got {text!r}")
    return value


def tcp_port(text: str) -> int:
    """A TCP port, 0-65535 (0: the system picks a free one)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0-65535, got {text!r}") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port 0-65535, got {text!r}")
    return value


def json_object(text: str) -> dict:
    """A JSON object of keyword arguments (every ``--*-kwargs`` flag)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"not JSON ({e}): {text!r}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"a JSON object of keyword arguments, e.g. '{{\"low_poly\": true}}', "
                                         f"got {text!r}")
    return value
