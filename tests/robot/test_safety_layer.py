"""SafetyLayer on franky-sim: what reaches the arm, what never does, and the watchdog."""

from __future__ import annotations

import time

import numpy as np
import pytest

from real_robot.errors import SafetyBypassError, UnsafeActionError
from real_robot.franky_arm import FrankyArm, FrankyArmConfig
from real_robot.safety import SafetyLayer, SafetyLimits
from real_robot.transforms import rotation_angle

TRACKING_TOLERANCE_M = 0.002


def test_layer_refuses_an_arm_faster_than_the_limits():
    arm = FrankyArm(FrankyArmConfig(robot_ip="172.16.0.2", relative_dynamics_factor=0.5))
    with pytest.raises(ValueError, match=r"relative_dynamics_factor=0.5, above max_relative_dynamics_factor=0.2"):
        SafetyLayer(arm, SafetyLimits())


def test_one_arm_takes_one_layer():
    arm = FrankyArm(FrankyArmConfig(robot_ip="172.16.0.2"))
    with SafetyLayer(arm, SafetyLimits()):
        with pytest.raises(SafetyBypassError, match="one arm takes one safety layer"):
            SafetyLayer(arm, SafetyLimits())
    SafetyLayer(arm, SafetyLimits()).close()  # released on close


@pytest.mark.parametrize("bad", [
    [np.nan, 0, 0, 0, 0, 0, 0],
    [0, 0, 0, 0, 0, np.inf, 0],
    [0, 0, 0, 0, 0, 0, -np.inf],
])
@pytest.mark.reliability(fault='NaN / inf actions to the arm (franky-sim)', cases=1,
                         outcome='refused: the arm stops, nothing sent')
def test_non_finite_action_stops_the_arm_and_sends_nothing(layer_factory, settled, bad):
    # asynchronous steps: a valid step is still running when the bad action arrives
    with layer_factory({"relative_dynamics_factor": 0.1, "wait_for_motion": False}) as layer:
        start = layer.observation().tcp_position_m
        layer.send_action([0.4, 0, 0, 0, 0, 0, -1])
        time.sleep(0.1)
        with pytest.raises(UnsafeActionError, match="non-finite values.*nothing was sent and the arm was stopped"):
            layer.send_action(bad)
        end = settled(layer)
        assert end[0] - start[0] < 0.04 - 0.005  # the running step was cut short
        np.testing.assert_allclose(end[1:], start[1:], atol=TRACKING_TOLERANCE_M)  # and nothing else was sent
        assert layer.pop_clamp_counts()["non_finite"] == 1


@pytest.mark.reliability(fault='malformed actions to the arm (franky-sim)', cases=1,
                         outcome='refused with a clear error, the arm unmoved')
@pytest.mark.parametrize("bad", [[0.1] * 6, [[0.1] * 7], "forward", ["0.1"] * 7, np.array([0.1] * 6 + [1j]),
                                 "torch_with_grad"])
def test_malformed_action_is_refused(homed_layer, bad):
    """Also numbers that are not real ones: a complex gripper value would have lost its imaginary
    part (1j: "open"), strings been parsed, a tensor that needs grad raised a raw RuntimeError."""
    if isinstance(bad, str) and bad == "torch_with_grad":
        import torch

        bad = torch.zeros(7, requires_grad=True)
    before = homed_layer.observation().tcp_position_m
    with pytest.raises(UnsafeActionError, match="an action is 7 numbers"):
        homed_layer.send_action(bad)
    np.testing.assert_allclose(homed_layer.observation().tcp_position_m, before, atol=1e-4)


@pytest.mark.reliability(fault="huge actions toward the box's corners (franky-sim)", cases=12,
                         outcome='the TCP stays in the box, per-step caps held')
def test_adversarial_actions_never_leave_the_box_or_exceed_the_caps(layer_factory, home_tcp_position_m):
    home = np.asarray(home_tcp_position_m)
    limits = dict(workspace_min_m=tuple(home - 0.02), workspace_max_m=tuple(home + 0.02),
                  max_translation_per_step_m=0.02, max_rotation_per_step_rad=0.05)
    with layer_factory(**limits) as layer:
        lo, hi = np.asarray(layer.limits.workspace_min_m), np.asarray(layer.limits.workspace_max_m)
        target_lo, target_hi = map(np.asarray, layer.limits.target_box_m)  # 1 cm inside the box
        # huge pushes toward one corner, then the opposite one: every face of the target box is hit.
        # Four capped diagonal steps (1.15 cm per axis) cross its 2 cm.
        for direction in ([1, 1, 1], [-1, -1, -1], [1, -1, 1]):
            for _ in range(4):
                before = layer.observation().T_base_from_tcp
                sent = layer.send_action([*(1e3 * np.asarray(direction)), 50.0, -50.0, 50.0, 1e6])
                after = layer.observation().T_base_from_tcp
                assert "action_range" in sent.clamps
                assert np.linalg.norm(sent.translation_m) <= 0.02 + 1e-9
                assert np.linalg.norm(after[:3, 3] - before[:3, 3]) <= 0.02 + TRACKING_TOLERANCE_M
                assert rotation_angle(after[:3, :3].T @ before[:3, :3]) <= 0.05 + np.radians(0.3)
                assert np.all(after[:3, 3] >= lo) and np.all(after[:3, 3] <= hi)
            # it got to the corner: the target box is enforced, not just never reached
            corner = np.where(np.asarray(direction) > 0, target_hi, target_lo)
            np.testing.assert_allclose(layer.observation().tcp_position_m, corner, atol=TRACKING_TOLERANCE_M)
        counts = layer.pop_clamp_counts()
        assert counts["workspace"] >= 3 and counts["action_range"] == 12 and counts["rotation_cap"] >= 1


@pytest.mark.reliability(fault='the policy stalls (no action follows)', cases=1,
                         outcome='the watchdog stops the arm within its deadline')
def test_watchdog_stops_a_motion_no_action_follows(layer_factory, settled):
    timeout_s = 0.15
    with layer_factory({"relative_dynamics_factor": 0.05, "wait_for_motion": False},
                       watchdog_timeout_s=timeout_s) as layer:
        start = layer.observation().tcp_position_m
        layer.send_action([0.5, 0, 0, 0, 0, 0, -1])  # 5 cm, slow: about a second without a stop
        sent_s = time.monotonic()
        time.sleep(timeout_s + 0.3)
        assert layer.last_watchdog_trip_s is not None
        assert timeout_s - 0.01 <= layer.last_watchdog_trip_s - sent_s <= timeout_s + 0.1
        end = settled(layer)
        assert end[0] - start[0] < 0.05 - 0.01
        assert layer.pop_clamp_counts()["watchdog"] == 1


def test_watchdog_stays_quiet_while_actions_keep_coming(layer_factory):
    with layer_factory(home=False, watchdog_timeout_s=0.3) as layer:
        for _ in range(6):
            layer.send_action([0, 0, 0, 0, 0, 0, -1])
            time.sleep(0.1)
        assert layer.last_watchdog_trip_s is None
        time.sleep(0.45)
        assert layer.last_watchdog_trip_s is not None


def test_dry_run_sends_nothing(layer_factory):
    with layer_factory(dry_run=True, home=False) as layer:
        before = layer.observation()
        for action in ([1, 0, 0, 0, 0, 1, 1], [0, -1, 0.5, 0.5, 0, 0, -1], [0, 0, -1, 0, 0, 0, 1]):
            sent = layer.send_action(action)
            assert sent.dry_run and np.linalg.norm(sent.translation_m) > 0.01
        layer.home()
        after = layer.observation()
    np.testing.assert_allclose(after.T_base_from_tcp, before.T_base_from_tcp, atol=1e-4)
    assert abs(after.gripper_width_m - before.gripper_width_m) < 1e-4


def test_gripper_changes_are_rate_limited(layer_factory):
    with layer_factory(dry_run=True, home=False, gripper_min_interval_s=0.3) as layer:
        assert layer.send_action([0, 0, 0, 0, 0, 0, 1]).gripper_changed  # the first command always goes
        held = layer.send_action([0, 0, 0, 0, 0, 0, -1])
        assert not held.gripper_changed and held.gripper_close and "gripper_rate" in held.clamps
        time.sleep(0.35)
        later = layer.send_action([0, 0, 0, 0, 0, 0, -1])
        assert later.gripper_changed and not later.gripper_close
        assert layer.pop_clamp_counts()["gripper_rate"] == 1
        assert layer.pop_clamp_counts()["gripper_rate"] == 0  # popped: counts restart per episode


def test_sent_action_is_what_the_twin_would_execute(homed_layer):
    # inside every limit the step is sent as asked, and `action` maps back to the same action
    action = np.array([0.1, -0.2, 0.05, 0.2, -0.1, 0.3, 1.0], dtype=np.float32)
    sent = homed_layer.send_action(action)
    assert sent.clamps == ()
    np.testing.assert_allclose(sent.action, action, atol=1e-6)
    np.testing.assert_allclose(homed_layer.observation().T_base_from_tcp, sent.T_base_from_tcp_target, atol=0.002)


def _send_in_thread(layer, action):
    """``send_action`` from another thread (as the ROS bridge's executor): ``(thread, result)``."""
    import threading

    result = {}
    thread = threading.Thread(target=lambda: result.update(sent=layer.send_action(action)))
    thread.start()
    return thread, result


@pytest.mark.reliability(fault='a stop while an action is being sent (another thread)', cases=2,
                         outcome='the stop wins: nothing after it reaches the arm')
def test_a_stop_during_an_action_wins_over_what_it_had_not_sent(layer_factory, settled):
    # waiting out the step rate: the stop comes before the motion, so nothing is sent
    with layer_factory(min_step_interval_s=0.6) as layer:
        layer.open_gripper()
        layer.send_action([0.1, 0, 0, 0, 0, 0, -1])  # synchronous: at its target when it returns
        before = layer.observation().tcp_position_m
        thread, result = _send_in_thread(layer, [0.3, 0, 0, 0, 0, 0, 1])  # 3 cm and close the gripper
        time.sleep(0.2)  # it waits for 0.6 s after the last step
        layer.stop()
        thread.join(5.0)
        sent = result["sent"]
        assert sent.preempted and not sent.gripper_changed and np.linalg.norm(sent.translation_m) == 0
        assert sent.clamps == () and layer.pop_clamp_counts()["translation_cap"] == 0  # nothing sent, nothing capped
        np.testing.assert_allclose(settled(layer), before, atol=TRACKING_TOLERANCE_M)
        assert layer.observation().gripper_width_m > 0.07  # still open
        assert not layer.send_action([0.1, 0, 0, 0, 0, 0, -1]).preempted  # the next action moves again
    # mid-motion: the move is cut, and the gripper change that would follow it is not sent
    with layer_factory({"relative_dynamics_factor": 0.05}) as layer:
        start = layer.observation().tcp_position_m
        thread, result = _send_in_thread(layer, [0.4, 0, 0, 0, 0, 0, 1])
        time.sleep(0.3)
        layer.stop()
        thread.join(10.0)
        sent = result["sent"]
        assert sent.preempted and not sent.gripper_changed and not sent.gripper_close
        assert sent.action[6] == -1.0  # what was really sent: the gripper's close was not
        assert settled(layer)[0] - start[0] < 0.04 - 0.005
        assert layer.observation().gripper_width_m > 0.07


def test_an_episode_starts_open_even_right_after_the_gripper_closed(layer_factory):
    with layer_factory(home=False, gripper_min_interval_s=0.5) as layer:
        layer.send_action([0, 0, 0, 0, 0, 0, -1])
        time.sleep(0.55)
        assert layer.send_action([0, 0, 0, 0, 0, 0, 1]).gripper_changed
        assert layer.observation().gripper_width_m < 0.07
        start_s = time.monotonic()
        layer.open_gripper()  # a reset: waits out the interval instead of holding the command
        assert time.monotonic() - start_s >= 0.4
        assert layer.observation().gripper_width_m > 0.07
        assert layer.pop_clamp_counts()["gripper_rate"] == 0


def test_dry_run_stops_nothing_either(layer_factory):
    """A ROS arm's stop publishes a target: in dry run the layer leaves the arm alone entirely."""
    with layer_factory(dry_run=True, home=False, watchdog_timeout_s=0.1) as layer:
        stops = []
        real_stop = layer.arm.stop
        layer.arm.stop = lambda: (stops.append(1), real_stop())
        layer.send_action([0.1, 0, 0, 0, 0, 0, -1])
        time.sleep(0.3)  # the watchdog fires
        layer.stop()
        with pytest.raises(UnsafeActionError):
            layer.send_action([np.nan] * 7)
        layer.close()
        assert layer.last_watchdog_trip_s is not None and stops == []


def test_a_watchdog_firing_that_an_action_overtook_does_not_stop_it(layer_factory):
    with layer_factory(home=False) as layer:
        stops = []
        layer.arm.stop = lambda: stops.append(1)
        layer._watchdog.kick()  # an action ended between the firing and the stop's lock
        layer._on_watchdog()
        assert stops == [] and layer.last_watchdog_trip_s is None
        layer._watchdog.disarm()  # silence: the firing stops the arm
        layer._on_watchdog()
        assert stops == [1]
        layer.arm.stop = type(layer.arm).stop.__get__(layer.arm)


def test_a_stop_after_an_action_left_its_queue_wins_over_it(layer_factory, settled):
    """A queue's consumer takes an action and its ``stop_count`` together; a stop between the take and
    the send (another thread's, answered already) preempts it: nothing of it reaches the arm."""
    with layer_factory(home=False, gripper_min_interval_s=0.0) as layer:
        layer.open_gripper()
        before = settled(layer)
        taken = layer.stop_count
        layer.stop()  # e.g. the ROS bridge's ~/stop, between the take and the send
        sent = layer.send_action([0.2, 0, 0, 0, 0, 0, 1], stops_since=taken)
        assert sent.preempted and not sent.gripper_changed and np.linalg.norm(sent.translation_m) == 0
        np.testing.assert_allclose(settled(layer), before, atol=TRACKING_TOLERANCE_M)
        assert layer.observation().gripper_width_m > 0.07  # still open
        assert not layer.send_action([0.2, 0, 0, 0, 0, 0, -1], stops_since=layer.stop_count).preempted


def test_deferred_interrupts_deliver_each_signal_once_after_the_block(ctrl_c_raises):
    import os
    import signal

    from real_robot.lifecycle import deferred_interrupts

    got = []
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: got.append(signum))
    try:
        ran = []
        with pytest.raises(KeyboardInterrupt):
            with deferred_interrupts():
                with deferred_interrupts():  # nested: held until the outer block ends
                    for _ in range(2):
                        os.kill(os.getpid(), signal.SIGINT)
                        os.kill(os.getpid(), signal.SIGTERM)
                        time.sleep(0.01)  # a handler would run by now
                    ran.append("inner")
                ran.append("outer")
        assert ran == ["inner", "outer"] and got == [signal.SIGTERM]
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handlers are back
    finally:
        signal.signal(signal.SIGTERM, previous)


@pytest.mark.reliability(fault='a second Ctrl-C while closing stops the arm (franky-sim)', cases=1,
                         outcome='the stop and the release end first; the interrupt is raised after')
def test_a_ctrl_c_while_closing_waits_for_the_stop_and_the_release(homed_layer, ctrl_c_raises):
    import os
    import signal

    layer, arm = homed_layer, homed_layer.arm
    real_stop, stopped = arm.stop, []

    def interrupted_stop():
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # Python runs the handler here, before the stop is sent
        real_stop()
        stopped.append(True)

    arm.stop = interrupted_stop
    try:
        with pytest.raises(KeyboardInterrupt):
            layer.close()
    finally:
        del arm.stop
    assert stopped == [True], "the interrupt cut the arm's stop"
    SafetyLayer(arm, layer.limits).close()  # released: the arm takes a new layer
