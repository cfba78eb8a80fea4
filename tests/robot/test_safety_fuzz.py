"""Random and adversarial action chunks through the SafetyLayer into franky-sim.

Every chunk is sent action by action without waiting for the motion (as fast as the layer allows),
under the conservative default caps and a small box around the home pose. After every action the
command and the measured TCP are checked against the limits, and every call that reaches the arm is
recorded: commands stay in the target box (the box less ``workspace_margin_m``) and the target
window (the orientation window less ``orientation_margin_rad``), the measured TCP in the box and the
window themselves, the caps always hold, and no non-finite number ever reaches franky.

CI runs 300 chunks (about 30 s: the layer paces steps to 50 Hz, ``min_step_interval_s``);
``VLA_SAFETY_FUZZ_CHUNKS=10000`` runs the reliability report's 10,000 (``bench/reliability.py`` sets it).
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from real_robot.errors import UnsafeActionError
from real_robot.safety import orientation_excess_rad
from real_robot.transforms import rotation_angle, rotvec_to_matrix

FUZZ_CHUNKS = int(os.environ.get("VLA_SAFETY_FUZZ_CHUNKS", "300"))
DYNAMICS_FACTOR = 0.2  # SafetyLimits' default max_relative_dynamics_factor
KINDS = ("uniform", "huge", "non_finite", "oscillating", "drift", "spin", "tiny", "dtypes")


def chunk_stream(rng: np.random.Generator, n_chunks: int):
    """Yield ``(kind, chunk [k, 7])``: segments of 1-20 chunks of one kind, 1-8 actions each. Drifts
    keep one face (spins one rotation axis) for 10-20 chunks so that they reach the box (the window)."""
    emitted = 0
    while emitted < n_chunks:
        kind = KINDS[rng.integers(len(KINDS))]
        face = rng.integers(3), rng.choice([-1.0, 1.0])
        axis = rng.normal(size=3)
        length = int(rng.integers(10 if kind in ("drift", "spin") else 1, 21))
        for _ in range(min(length, n_chunks - emitted)):
            k = int(rng.integers(1, 9))
            chunk = rng.uniform(-1, 1, (k, 7))
            if kind == "huge":
                chunk = chunk * 10.0 ** rng.integers(1, 308, (k, 7))
            elif kind == "non_finite":
                chunk[rng.integers(k), rng.integers(7)] = rng.choice([np.nan, np.inf, -np.inf])
            elif kind == "oscillating":  # full scale, sign flipping every action, gripper too
                chunk = np.sign(chunk[0]) * (-1.0) ** np.arange(k)[:, None]
            elif kind == "drift":
                chunk = 0.3 * chunk
                chunk[:, face[0]] += face[1]
            elif kind == "spin":  # full-scale rotation about one axis: the orientation window's edges
                chunk[:, 3:6] = 3.0 * axis / np.linalg.norm(axis)
            elif kind == "tiny":
                chunk = chunk * rng.choice([1e-300, 1e-12, -0.0])
            elif kind == "dtypes":
                chunk = chunk.astype(rng.choice([np.float16, np.float32, np.int64]))
            emitted += 1
            yield kind, chunk


@pytest.mark.slow
@pytest.mark.timeout(max(600, int(0.2 * FUZZ_CHUNKS)))  # about 0.1 s a chunk: steps are paced to 50 Hz
@pytest.mark.reliability(fault="random and adversarial action chunks (NaN, inf, huge, oscillating, drifting "
                               "to every face, spinning) into franky-sim", cases=FUZZ_CHUNKS,
                         outcome="the command and the measured TCP stay in the box and the orientation window, "
                                 "per-step caps held, no non-finite value reaches the arm")
def test_fuzzed_chunks_never_leave_the_limits(layer_factory, home_tcp_position_m):
    home = np.asarray(home_tcp_position_m)
    limits = dict(workspace_min_m=tuple(home - 0.06), workspace_max_m=tuple(home + 0.06),
                  max_translation_per_step_m=0.02, max_rotation_per_step_rad=0.05, gripper_min_interval_s=1.0,
                  max_relative_dynamics_factor=DYNAMICS_FACTOR)
    with layer_factory({"wait_for_motion": False, "relative_dynamics_factor": DYNAMICS_FACTOR}, **limits) as layer:
        lo, hi = np.asarray(layer.limits.workspace_min_m), np.asarray(layer.limits.workspace_max_m)
        target_lo, target_hi = map(np.asarray, layer.limits.target_box_m)
        margin = layer.limits.workspace_margin_m
        turn_margin = layer.limits.orientation_margin_rad
        reached_arm: list[np.ndarray] = []  # every target pose the arm was really sent
        sent_s: list[float] = []  # and when
        move_to_pose = layer.arm.move_to_pose

        def recording_move_to_pose(T_base_from_tcp, **kwargs):
            reached_arm.append(np.array(T_base_from_tcp, dtype=np.float64))
            sent_s.append(time.monotonic())
            return move_to_pose(T_base_from_tcp, **kwargs)

        layer.arm.move_to_pose = recording_move_to_pose
        refused, kinds_seen, furthest, outside, turned_past = 0, set(), np.zeros(3), 0.0, 0.0
        for kind, chunk in chunk_stream(np.random.default_rng(0), FUZZ_CHUNKS):
            kinds_seen.add(kind)
            for action in chunk:
                if not np.all(np.isfinite(action.astype(np.float64))):
                    with pytest.raises(UnsafeActionError, match="non-finite"):
                        layer.send_action(action)
                    refused += 1
                    break  # a refused action ends its chunk, as it ends the episode on the robot
                n_sent = len(reached_arm)
                sent = layer.send_action(action)
                target = sent.T_base_from_tcp_target
                if len(reached_arm) > n_sent:  # what the arm was sent is what the layer reports
                    np.testing.assert_array_equal(reached_arm[-1], target)
                else:  # only a zero step sends nothing
                    assert np.linalg.norm(sent.translation_m) < 1e-5 and np.linalg.norm(sent.rotation_rotvec_rad) < 1e-5
                assert np.linalg.norm(sent.translation_m) <= 0.02 * (1 + 1e-6), (kind, action)
                assert np.linalg.norm(sent.rotation_rotvec_rad) <= 0.05 * (1 + 1e-6), (kind, action)
                # the target box, widened only to where the TCP was measured when the command was made
                # (after the arm's tracking carried it past a target): never further out
                start = target[:3, 3] - sent.translation_m
                assert np.all(target[:3, 3] >= np.minimum(target_lo, start) - 1e-9), (kind, action, start)
                assert np.all(target[:3, 3] <= np.maximum(target_hi, start) + 1e-9), (kind, action, start)
                assert np.all(start >= lo) and np.all(start <= hi), (kind, action, start)
                # the target window likewise: never further out than the measured start, which is in the window
                start_R = rotvec_to_matrix(sent.rotation_rotvec_rad).T @ target[:3, :3]
                start_excess = orientation_excess_rad(start_R, layer.limits, turn_margin)
                turned_past = max(turned_past, start_excess)
                assert turned_past < turn_margin, (kind, action, np.degrees(turned_past))
                assert orientation_excess_rad(target[:3, :3], layer.limits, turn_margin) <= start_excess + 1e-6, (
                    kind, action)
                measured = layer.observation().T_base_from_tcp
                # how far past the target box the arm's tracking carried it: within the margin, in the box
                outside = max(outside, float(np.max(np.maximum(target_lo - measured[:3, 3],
                                                               measured[:3, 3] - target_hi))))
                assert outside < margin, (kind, action, measured[:3, 3])
                turned_past = max(turned_past, orientation_excess_rad(measured[:3, :3], layer.limits, turn_margin))
                assert turned_past < turn_margin, (kind, action, np.degrees(turned_past))
                furthest = np.maximum(furthest, np.abs(measured[:3, 3] - home))
        # The window pressed for certain: the spins above reach it only where the arm keeps up with
        # them, which a busy machine does not assure. Full-scale tilts about x, each one waited for.
        gripper = 1.0 if sent.gripper_close else -1.0
        for _ in range(40):
            if layer.clamp_counts["orientation"]:
                break
            sent = layer.send_action([0, 0, 0, 1.0, 0, 0, gripper])
            start_R = rotvec_to_matrix(sent.rotation_rotvec_rad).T @ sent.T_base_from_tcp_target[:3, :3]
            assert orientation_excess_rad(sent.T_base_from_tcp_target[:3, :3], layer.limits, turn_margin) <= (
                orientation_excess_rad(start_R, layer.limits, turn_margin) + 1e-6)
            deadline_s = time.monotonic() + 1.0
            while time.monotonic() < deadline_s and rotation_angle(
                    layer.observation().T_base_from_tcp[:3, :3].T @ sent.T_base_from_tcp_target[:3, :3]) > 0.005:
                time.sleep(0.02)
            turned_past = max(turned_past, orientation_excess_rad(layer.observation().T_base_from_tcp[:3, :3],
                                                                  layer.limits, turn_margin))
            assert turned_past < turn_margin, np.degrees(turned_past)
        counts = layer.pop_clamp_counts()
        final = layer.observation()
    assert kinds_seen == set(KINDS)
    assert refused > 0 and counts["non_finite"] == refused
    assert np.all(np.isfinite(np.stack(reached_arm)))
    assert len(reached_arm) > 3 * FUZZ_CHUNKS  # most actions really moved the arm
    assert counts["step_rate"] > 0 and np.min(np.diff(sent_s)) >= 0.02  # sent faster than 50 Hz: paced
    # every limit was really pressed: a face of the target box was reached, each cap clamped something
    assert np.max(furthest) >= 0.06 - margin
    for kind in ("action_range", "translation_cap", "rotation_cap", "workspace", "orientation", "gripper_rate"):
        assert counts[kind] > 0, (kind, counts)
    print(f"{FUZZ_CHUNKS} chunks, {len(reached_arm)} steps sent, {refused} refused, the measured TCP at most "
          f"{1e3 * outside:.2f} mm past the target box (margin {1e3 * margin:g} mm) and {np.degrees(turned_past):.2f} "
          f"deg past the target window (margin {np.degrees(turn_margin):.2f} deg); clamps: {counts}")
    assert np.all(np.isfinite(final.T_base_from_tcp)) and np.all(final.tcp_position_m >= lo)
