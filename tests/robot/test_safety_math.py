"""The safety limits and the pure step limiter: validation, loading, and the guarantees as properties
over adversarial steps (hypothesis), plus the watchdog thread on its own."""

from __future__ import annotations

import json
import math
import threading
import time

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from real_robot.safety import SafetyLimits, Watchdog, limit_step, orientation_excess_rad, orientation_excesses_rad
from real_robot.transforms import pose_matrix, quaternion_wxyz_to_matrix, rotation_angle, rotvec_to_matrix
from real_robot.twin_action import action_to_step

LIMITS = SafetyLimits()
R_REF = quaternion_wxyz_to_matrix(LIMITS.reference_quaternion_wxyz)
MARGIN = LIMITS.orientation_margin_rad
EPS = 1e-9


# ----- the limits ------------------------------------------------------------------------------

def test_defaults_are_conservative_and_contain_the_home_pose():
    assert LIMITS.max_translation_per_step_m <= 0.02 and LIMITS.max_rotation_per_step_rad <= 0.05
    assert LIMITS.max_relative_dynamics_factor <= 0.2 and not LIMITS.dry_run
    home_tcp = np.array([0.3069, 0.0, 0.4869])  # the Franka's TCP at the default home joints
    # in the box targets are commanded in (the box shrunk by a margin for the arm's tracking): the
    # first action from home is the policy's, not a step back from a face
    assert LIMITS.workspace_margin_m >= 0.005
    assert np.all(home_tcp > LIMITS.target_box_m[0]) and np.all(home_tcp < LIMITS.target_box_m[1])
    assert LIMITS.target_box_m == (tuple(v + LIMITS.workspace_margin_m for v in LIMITS.workspace_min_m),
                                   tuple(v - LIMITS.workspace_margin_m for v in LIMITS.workspace_max_m))


@pytest.mark.parametrize("field, value, message", [
    ("workspace_min_m", (0.5, 0.4, 0.1), r"the y range \[0.4, 0.3\] is empty"),
    ("workspace_max_m", (1.0, 1.0), r"workspace_max_m=\(1.0, 1.0\): 3 finite numbers"),
    ("workspace_max_m", (1.0, float("nan"), 1.0), "3 finite numbers"),
    ("reference_quaternion_wxyz", (1.0, 1.0, 0.0, 0.0), "a unit quaternion"),
    ("max_tilt_rad", math.pi / 2, r"max_tilt_rad=1.57\d*: a number in \(0, 1.5708\)"),
    ("max_yaw_rad", 0.0, r"max_yaw_rad=0.0: a number in \(0, 3.14159\]"),
    ("max_translation_per_step_m", -0.01, r"max_translation_per_step_m=-0.01: a number in \(0, 0.2\]"),
    ("max_rotation_per_step_rad", "0.1", "max_rotation_per_step_rad='0.1'"),
    ("max_relative_dynamics_factor", 1.5, r"max_relative_dynamics_factor=1.5: a number in \(0, 1\]"),
    ("watchdog_timeout_s", 0, r"watchdog_timeout_s=0: a number in \(0, 60\]"),
    ("gripper_min_interval_s", -1, r"gripper_min_interval_s=-1: seconds in \[0, 60\)"),
    ("min_step_interval_s", 1.0, r"min_step_interval_s=1.0: seconds in \[0, 1\)"),
    ("dry_run", "yes", "dry_run='yes': true or false"),
    ("home_joint_positions_rad", (0.0,) * 6, "home_joint_positions_rad=.*7 finite numbers"),
    ("workspace_max_m", "789", "workspace_max_m='789': 3 numbers"),  # not (7.0, 8.0, 9.0)
    ("workspace_max_m", ("0.7", 0.3, 0.55), "workspace_max_m=.*3 numbers"),
    ("gripper_min_interval_s", True, r"gripper_min_interval_s=True: seconds in \[0, 60\)"),
    ("workspace_margin_m", -0.001, r"workspace_margin_m=-0.001: metres in \[0, 0.21\) \(half the box's narrowest"),
    ("workspace_margin_m", 0.21, r"workspace_margin_m=0.21: metres in \[0, 0.21\)"),  # no box left for targets
    ("workspace_margin_m", True, "workspace_margin_m=True"),
    ("orientation_margin_rad", -0.01, r"orientation_margin_rad=-0.01: radians in \[0, 0.6\) \(the smaller of max_tilt"),
    ("orientation_margin_rad", 0.6, r"orientation_margin_rad=0.6: radians in \[0, 0.6\)"),  # no window for targets
    ("orientation_margin_rad", None, "orientation_margin_rad=None"),
    # units: millimetres or degrees would switch the box off or send the arm far from any home
    ("workspace_min_m", (280.0, -300.0, 100.0), r"workspace_min_m=\(280.0, -300.0, 100.0\): metres in the robot "
                                                r"base frame, each within 1.155 m of the base .*millimetres"),
    ("workspace_max_m", (5.0, 5.0, 5.0), r"workspace_max_m=.*within 1.155 m"),
    ("home_joint_positions_rad", (0, -45, 0, -135, 0, 90, 45), r"joint\(s\) \[2, 4, 6, 7\] outside a Franka's "
                                                              r"limits \(radians.*degrees\?"),
])
def test_limits_refuse_bad_values_naming_the_field(field, value, message):
    with pytest.raises(ValueError, match=message):
        SafetyLimits(**{field: value})


def test_limits_load_from_yaml_and_json(tmp_path):
    (tmp_path / "cell.yaml").write_text("workspace_min_m: [0.3, -0.2, 0.05]\nmax_translation_per_step_m: 0.01\n"
                                        "dry_run: true\n")
    limits = SafetyLimits.from_file(tmp_path / "cell.yaml")
    assert limits.workspace_min_m == (0.3, -0.2, 0.05) and limits.max_translation_per_step_m == 0.01
    assert limits.dry_run and limits.workspace_max_m == SafetyLimits().workspace_max_m
    (tmp_path / "cell.json").write_text(json.dumps({"max_yaw_rad": 1.0, "watchdog_timeout_s": 0.5}))
    limits = SafetyLimits.from_file(tmp_path / "cell.json")
    assert limits.max_yaw_rad == 1.0 and limits.watchdog_timeout_s == 0.5


def test_limits_file_refuses_unknown_keys_and_bad_values(tmp_path):
    path = tmp_path / "cell.yaml"
    path.write_text("max_translation_step_m: 0.01\n")  # a typo must not silently keep the default
    with pytest.raises(ValueError, match=r"unknown safety limit\(s\) \['max_translation_step_m'\]; allowed: .*"
                                         r"'max_translation_per_step_m'"):
        SafetyLimits.from_file(path)
    path.write_text("max_tilt_rad: 3\n")
    with pytest.raises(ValueError, match="max_tilt_rad=3"):
        SafetyLimits.from_file(path)
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ValueError, match="a mapping of limit names to values"):
        SafetyLimits.from_file(path)
    (tmp_path / "cell.toml").write_text("")
    with pytest.raises(ValueError, match=r"\.yaml, \.yml or \.json"):
        SafetyLimits.from_file(tmp_path / "cell.toml")


def test_a_limit_given_twice_is_refused_and_exponents_read_as_numbers(tmp_path):
    """YAML and JSON keep the last of two equal keys: a cell file's tight cap followed by a loose one
    would silently be the loose one. PyYAML reads ``1e-2`` as a string (YAML 1.1); here a number."""
    path = tmp_path / "cell.yaml"
    path.write_text("max_translation_per_step_m: 0.01\ndry_run: true\nmax_translation_per_step_m: 0.2\n")
    with pytest.raises(ValueError, match=r"the key max_translation_per_step_m \(line 3\) is given twice"):
        SafetyLimits.from_file(path)
    (tmp_path / "cell.json").write_text('{"max_yaw_rad": 0.5, "max_yaw_rad": 3.0}')
    with pytest.raises(ValueError, match="the key max_yaw_rad is given twice"):
        SafetyLimits.from_file(tmp_path / "cell.json")
    path.write_text("max_translation_per_step_m: 1e-2\nworkspace_min_m: [3e-1, -0.3, 0.1]\n")
    limits = SafetyLimits.from_file(path)
    assert limits.max_translation_per_step_m == 0.01 and limits.workspace_min_m == (0.3, -0.3, 0.1)


@pytest.mark.parametrize("name, content, message", [
    ("cell.yaml", None, "is a folder, not a file"),
    ("cell.yaml", b"\xda\x00\xff binary", "is not a text file"),
    ("cell.yaml", b"workspace_min_m: [0.3, 0.1\ndry_run: true\n", r"is not valid YAML \(line 2: "),
    ("cell.json", b'{"dry_run": true,}', r"is not valid JSON \(line 1: "),
], ids=["folder", "binary", "yaml-syntax", "json-syntax"])
def test_a_limits_file_that_is_not_a_mapping_is_named_in_one_line(tmp_path, name, content, message):
    path = tmp_path / name
    path.mkdir() if content is None else path.write_bytes(content)
    with pytest.raises(ValueError, match=f"{message}.*it must be a YAML/JSON mapping of limit names") as e:
        SafetyLimits.from_file(path)
    assert str(path) in str(e.value) and "\n" not in str(e.value)


# ----- the step limiter: hand-checked cases -------------------------------------------------------

def home_pose(position=(0.5, 0.0, 0.3)):
    return pose_matrix(position, R_REF)


def test_a_step_inside_every_limit_is_unchanged():
    t, R, clamps = limit_step([0.01, -0.005, 0.002], rotvec_to_matrix([0, 0, 0.03]), home_pose(), LIMITS)
    assert clamps == []
    np.testing.assert_allclose(t, [0.01, -0.005, 0.002])
    np.testing.assert_allclose(R, rotvec_to_matrix([0, 0, 0.03]), atol=1e-12)


def test_translation_is_capped_by_norm_keeping_its_direction():
    t, _, clamps = limit_step([0.03, 0.04, 0.0], np.eye(3), home_pose(), LIMITS)
    assert clamps == ["translation_cap"]
    np.testing.assert_allclose(t, [0.012, 0.016, 0.0])


def test_the_box_stops_the_tcp_at_its_face():
    # the target box's floor: workspace_margin_m above the box's, room for the arm's tracking
    floor = LIMITS.target_box_m[0][2]
    assert floor == pytest.approx(LIMITS.workspace_min_m[2] + LIMITS.workspace_margin_m)
    t, _, clamps = limit_step([0.0, 0.0, -0.02], np.eye(3), home_pose((0.5, 0.0, floor + 0.01)), LIMITS)
    assert clamps == ["workspace"]
    np.testing.assert_allclose(t, [0.0, 0.0, -0.01])


def test_outside_the_box_every_step_brings_the_tcp_back():
    outside = home_pose((0.8, 0.0, 0.3))  # 10 cm beyond x max
    for wanted in ([0.01, 0.0, 0.0], [0.0, 0.0, 0.0]):
        t, _, clamps = limit_step(wanted, np.eye(3), outside, LIMITS)
        # one capped step straight back toward the face: a target that only held the TCP outside would
        # let a moving arm's next overshoot start from there
        np.testing.assert_allclose(t, [-LIMITS.max_translation_per_step_m, 0.0, 0.0], atol=EPS)
        assert clamps == ["workspace", "translation_cap"]
    t, _, clamps = limit_step([-0.01, 0.01, 0.0], np.eye(3), outside, LIMITS)  # the inside axis keeps its share
    assert np.linalg.norm(t) == pytest.approx(LIMITS.max_translation_per_step_m) and t[0] < -0.019 and t[1] > 0
    x_face = LIMITS.target_box_m[1][0]
    t, _, clamps = limit_step([0.01, 0.0, 0.0], np.eye(3), home_pose((x_face + 0.01, 0.0, 0.3)), LIMITS)
    np.testing.assert_allclose(t, [-0.01, 0.0, 0.0], atol=EPS)  # 1 cm out: onto the face
    assert clamps == ["workspace"]


def test_rotation_is_capped_and_kept_in_the_target_window():
    _, R, clamps = limit_step([0, 0, 0], rotvec_to_matrix([0.3, 0, 0]), home_pose(), LIMITS)
    assert clamps == ["rotation_cap"]
    assert rotation_angle(R) == pytest.approx(LIMITS.max_rotation_per_step_rad)
    # 0.01 rad inside the target window (the window less orientation_margin_rad, room for the arm's tracking)
    assert MARGIN >= math.radians(1.0)
    tilted = pose_matrix((0.5, 0, 0.3), rotvec_to_matrix([LIMITS.max_tilt_rad - MARGIN - 0.01, 0, 0]) @ R_REF)
    _, R, clamps = limit_step([0, 0, 0], rotvec_to_matrix([0.04, 0, 0]), tilted, LIMITS)
    assert clamps == ["orientation"]
    assert orientation_excess_rad(R @ tilted[:3, :3], LIMITS, MARGIN) <= 1e-6
    assert rotation_angle(R) == pytest.approx(0.01, abs=1e-4)  # as far as the target window allows
    _, R, clamps = limit_step([0, 0, 0], rotvec_to_matrix([-0.04, 0, 0]), tilted, LIMITS)
    assert clamps == []  # turning back toward the reference is free


def test_past_the_target_window_each_step_turns_back_whatever_the_action():
    """A TCP the arm's tracking carried 0.02 rad past the target window's tilt edge, its yaw 0.05 rad
    inside: a policy pushing further out gets a step back instead (holding there would let each
    overshoot start from further out), and turns about the reference's z axis never take the yaw out."""
    R = (R_REF @ rotvec_to_matrix([LIMITS.max_tilt_rad - MARGIN + 0.02, 0, 0])
         @ rotvec_to_matrix([0, 0, LIMITS.max_yaw_rad - MARGIN - 0.05]))
    tilt0, yaw0 = orientation_excesses_rad(R, LIMITS, MARGIN)
    assert tilt0 == pytest.approx(0.02, abs=1e-3) and yaw0 == 0.0
    _, R_delta, clamps = limit_step([0, 0, 0], rotvec_to_matrix([0.05, 0, 0]), pose_matrix((0.5, 0, 0.3), R), LIMITS)
    assert clamps == ["orientation"]
    assert orientation_excesses_rad(R_delta @ R, LIMITS, MARGIN) == pytest.approx((0.0, 0.0), abs=1e-6)
    turn = rotvec_to_matrix(LIMITS.max_rotation_per_step_rad * R_REF[:, 2])  # about the reference z, base frame
    R = rotvec_to_matrix([0.1, 0, 0]) @ R  # now 0.12 rad past: back by a full capped step per action
    for _ in range(5):
        before, _ = orientation_excesses_rad(R, LIMITS, MARGIN)
        _, R_delta, clamps = limit_step([0, 0, 0], turn, pose_matrix((0.5, 0, 0.3), R), LIMITS)
        R = R_delta @ R
        tilt, yaw = orientation_excesses_rad(R, LIMITS, MARGIN)
        assert yaw <= 1e-6 and tilt <= max(0.0, before - 0.9 * LIMITS.max_rotation_per_step_rad) + 1e-6, (tilt, yaw, clamps)


# ----- the step limiter: properties over adversarial inputs ---------------------------------------

finite = st.floats(-1e6, 1e6, allow_nan=False)
vectors = st.tuples(finite, finite, finite).map(np.array)
unit_interval = st.floats(0.0, 1.0)


@st.composite
def poses_inside(draw):
    """A TCP pose inside the target box and the target orientation window."""
    lo, hi = map(np.array, LIMITS.target_box_m)
    position = lo + np.array([draw(unit_interval) for _ in range(3)]) * (hi - lo)
    R = draw(orientations(max_tilt_rad=LIMITS.max_tilt_rad - MARGIN, max_yaw_rad=LIMITS.max_yaw_rad - MARGIN))
    assume(orientation_excess_rad(R, LIMITS, MARGIN) == 0.0)  # the tilt shifts the measured yaw a little
    return pose_matrix(position, R)


@st.composite
def orientations(draw, max_tilt_rad: float, max_yaw_rad: float):
    """A TCP orientation tilted up to ``max_tilt_rad`` from the reference, yawed up to ``max_yaw_rad``."""
    tilt_axis_angle = draw(st.floats(0, 2 * math.pi))
    tilt = draw(st.floats(0, max_tilt_rad * 0.999))
    yaw = draw(st.floats(-max_yaw_rad * 0.999, max_yaw_rad * 0.999))
    # yaw about the reference's z, then tilt about a horizontal axis of the reference frame
    return R_REF @ (rotvec_to_matrix(tilt * np.array([math.cos(tilt_axis_angle), math.sin(tilt_axis_angle), 0]))
                    @ rotvec_to_matrix([0, 0, yaw]))


@st.composite
def rotations(draw):
    axis = draw(st.tuples(*[st.floats(-1, 1)] * 3).filter(lambda v: np.linalg.norm(v) > 1e-3))
    angle = draw(st.floats(0, math.pi))
    return rotvec_to_matrix(np.array(axis) / np.linalg.norm(axis) * angle)


@pytest.mark.reliability(fault='random robot steps from inside the workspace (hypothesis)', cases=300,
                         outcome='every commanded pose stays in the box and under the caps')
@settings(max_examples=300, deadline=None)
@given(pose=poses_inside(), translation=vectors, R_delta=rotations())
def test_from_inside_no_step_leaves_the_limits(pose, translation, R_delta):
    t, R, _ = limit_step(translation, R_delta, pose, LIMITS)
    target = pose[:3, 3] + t
    assert np.linalg.norm(t) <= LIMITS.max_translation_per_step_m + EPS
    lo, hi = map(np.array, LIMITS.target_box_m)
    assert np.all(target >= lo - EPS) and np.all(target <= hi + EPS)
    assert rotation_angle(R) <= LIMITS.max_rotation_per_step_rad + 1e-7
    assert orientation_excess_rad(R @ pose[:3, :3], LIMITS, MARGIN) <= 1e-6


@pytest.mark.reliability(fault='random robot turns from outside the orientation window (hypothesis)', cases=300,
                         outcome='no limit moves further out; each step turns back')
@settings(max_examples=300, deadline=None)
@given(R=orientations(max_tilt_rad=LIMITS.max_tilt_rad + 0.5, max_yaw_rad=math.pi), R_delta=rotations())
def test_from_outside_the_orientation_window_every_step_turns_back(R, R_delta):
    before = orientation_excesses_rad(R, LIMITS, MARGIN)
    assume(max(before) > 1e-6)
    _, R_step, clamps = limit_step([0, 0, 0], R_delta, pose_matrix((0.5, 0, 0.3), R), LIMITS)
    after = orientation_excesses_rad(R_step @ R, LIMITS, MARGIN)
    assert "orientation" in clamps
    assert rotation_angle(R_step) <= LIMITS.max_rotation_per_step_rad + 1e-7
    assert all(a <= b + 1e-7 for a, b in zip(after, before)), (before, after)  # each limit on its own
    # back by most of a capped step (the tilt's turn is not quite the shortest), or into the window
    assert sum(before) - sum(after) >= 0.8 * min(sum(before), LIMITS.max_rotation_per_step_rad), (before, after)


@pytest.mark.reliability(fault='random robot steps from outside the workspace (hypothesis)', cases=200,
                         outcome='no axis moves further out; each step comes back')
@settings(max_examples=200, deadline=None)
@given(position=vectors.map(lambda v: v * 1e-6), translation=vectors)
def test_from_outside_every_step_comes_back(position, translation):
    pose = pose_matrix(np.array([0.5, 0.0, 0.3]) + position, R_REF)  # up to 1 m off the box centre
    lo, hi = map(np.array, LIMITS.target_box_m)

    def outside_by(p):
        return np.maximum(lo - p, 0) + np.maximum(p - hi, 0)

    t, _, _ = limit_step(translation, np.eye(3), pose, LIMITS)
    before, after = outside_by(pose[:3, 3]), outside_by(pose[:3, 3] + t)
    assert np.all(after <= before + EPS)
    assert np.linalg.norm(t) <= LIMITS.max_translation_per_step_m + EPS
    if np.any(before > 0):  # outside: every step is a full capped step back, or lands in the box
        assert np.linalg.norm(t) == pytest.approx(LIMITS.max_translation_per_step_m) or not np.any(after > EPS)


@pytest.mark.reliability(fault='actions drifting toward every face of the box (hypothesis)', cases=10,
                         outcome='the face is reached, never passed')
@pytest.mark.parametrize("face", range(6))
@settings(max_examples=10, deadline=None)
@given(noise=st.lists(st.tuples(*[st.floats(-3, 3)] * 7), min_size=40, max_size=40))
def test_drifting_toward_a_face_reaches_it_and_never_passes(face, noise):
    # an ideal arm that lands exactly on each target, driven by a policy pushing out through one face
    axis, sign = divmod(face, 2)
    push = np.zeros(7)
    push[axis] = 1e3 if sign else -1e3
    pose = home_pose()
    lo, hi = map(np.array, LIMITS.target_box_m)
    for extra in noise:
        translation, R_delta, _, _ = action_to_step(push + np.array(extra))
        t, R, _ = limit_step(translation, R_delta, pose, LIMITS)
        pose = pose_matrix(pose[:3, 3] + t, R @ pose[:3, :3])
        assert np.all(pose[:3, 3] >= lo - EPS) and np.all(pose[:3, 3] <= hi + EPS)
        assert orientation_excess_rad(pose[:3, :3], LIMITS, MARGIN) <= 1e-6
    face_value = hi[axis] if sign else lo[axis]
    assert pose[axis, 3] == pytest.approx(face_value, abs=1e-6)  # pinned on the face it was pushed at


# ----- the watchdog ---------------------------------------------------------------------------------

def test_watchdog_fires_once_per_silence_within_its_deadline():
    fired: list[float] = []
    event = threading.Event()

    def on_timeout():
        fired.append(time.monotonic())
        event.set()

    dog = Watchdog(0.1, on_timeout)
    try:
        time.sleep(0.2)
        assert fired == []  # disarmed until the first kick
        for _ in range(5):  # kicked in time: silent
            dog.kick()
            time.sleep(0.05)
        assert fired == []
        kicked = time.monotonic()
        dog.kick()
        assert event.wait(1.0)
        assert 0.1 - 0.005 <= fired[0] - kicked <= 0.1 + 0.05
        time.sleep(0.25)
        assert len(fired) == 1  # once per silence
        dog.kick()
        dog.disarm()
        time.sleep(0.2)
        assert len(fired) == 1
    finally:
        dog.close()
