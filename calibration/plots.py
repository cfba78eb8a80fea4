"""The picture of a hand-eye solve: every method's per-sample residuals against the pass/fail
limits, so a bad sample or a method that disagrees is seen at a glance."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def plot_residuals(hand_eye, path: str | Path) -> Path:
    """Write ``path`` (PNG): translation (mm) and rotation (deg) residual of each sample, one line
    per method that solved, the chosen one bold, the limits dashed.

    Args:
        hand_eye: a ``calibration.hand_eye.HandEyeResult``.
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(8, 5), dpi=100)
    axes = fig.subplots(2, 1, sharex=True)
    for name, result in hand_eye.methods.items():
        if not result.ok:
            continue
        chosen = name == hand_eye.chosen
        style = dict(linewidth=2.5 if chosen else 1.0, alpha=1.0 if chosen else 0.6, marker="o", markersize=3,
                     label=f"{name}{' (chosen)' if chosen else ''}")
        samples = np.arange(len(result.residuals.trans_mm))
        axes[0].plot(samples, result.residuals.trans_mm, **style)
        axes[1].plot(samples, result.residuals.rot_deg, **style)
    axes[0].axhline(hand_eye.max_trans_mm, color="red", linestyle="--", linewidth=1, label="limit (RMS)")
    axes[1].axhline(hand_eye.max_rot_deg, color="red", linestyle="--", linewidth=1)
    axes[0].set_ylabel("board centre (mm)")
    axes[1].set_ylabel("board orientation (deg)")
    axes[1].set_xlabel("sample")
    axes[0].set_title(f"hand-eye residuals per sample: {'PASS' if hand_eye.passed else 'FAIL'}")
    axes[0].legend(fontsize=7, ncol=3)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path)
    return path
