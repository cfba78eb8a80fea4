"""RealSenseCamera through the real pyrealsense2 pipeline: a recording of synthetic frames written with
pyrealsense2's own recorder is played back; an absent camera fails at once."""

from __future__ import annotations

import time

import numpy as np
import pytest

from real_robot.errors import DeviceNotConnectedError, DeviceNotFoundError, StaleFrameError
from real_robot.realsense import RealSenseCamera, RealSenseCameraConfig, write_recording

HEIGHT, WIDTH, FPS, NUM_FRAMES = 48, 64, 30, 8


def synthetic_image(i: int) -> np.ndarray:
    """Frame ``i``: red encodes the index, green a horizontal ramp, blue a vertical one."""
    image = np.zeros((HEIGHT, WIDTH, 3), np.uint8)
    image[..., 0] = 20 * i + 5
    image[..., 1] = np.arange(WIDTH, dtype=np.uint8)[None, :] * 3
    image[..., 2] = np.arange(HEIGHT, dtype=np.uint8)[:, None] * 5
    return image


@pytest.fixture(scope="module")
def recording(tmp_path_factory):
    path = tmp_path_factory.mktemp("realsense") / "synthetic.db3"
    return write_recording(path, [synthetic_image(i) for i in range(NUM_FRAMES)], fps=FPS)


def test_playback_through_the_pipeline_returns_the_recorded_frames(recording):
    camera = RealSenseCamera(RealSenseCameraConfig(width=WIDTH, height=HEIGHT, fps=FPS, playback_file=str(recording)))
    frames = []
    with camera:
        while True:
            try:
                frames.append(camera.read(timeout_ms=500))
            except StaleFrameError:
                break  # the recording has ended
        newest = camera.read_latest(max_age_ms=5000)
        time.sleep(0.1)
        with pytest.raises(StaleFrameError, match="above max_age_ms=50"):
            camera.read_latest(max_age_ms=50)
    assert len(frames) >= NUM_FRAMES - 2  # a playback may drop the first frame; read() may skip one
    numbers = [f.frame_number for f in frames]
    assert numbers == sorted(set(numbers)) and numbers[-1] == NUM_FRAMES - 1
    timestamps = [f.timestamp_ms for f in frames]
    assert all(b > a for a, b in zip(timestamps, timestamps[1:]))
    for frame in frames:
        assert frame.image.dtype == np.uint8 and frame.image.shape == (HEIGHT, WIDTH, 3)
        np.testing.assert_array_equal(frame.image, synthetic_image(frame.frame_number))  # RGB, bit-exact
        assert frame.timestamp_ms == pytest.approx(1000.0 + frame.frame_number * 1000.0 / FPS, abs=0.01)
    assert newest.frame_number == NUM_FRAMES - 1
    assert not camera.is_connected


def test_frames_are_independent_of_the_pipeline_buffers(recording):
    # librealsense recycles frame memory: an image kept after later frames arrived must not change
    camera = RealSenseCamera(RealSenseCameraConfig(width=WIDTH, height=HEIGHT, playback_file=str(recording)))
    with camera:
        first = camera.read(timeout_ms=1000)
        kept = first.image.copy()
        time.sleep(0.2)  # several frames later
        camera.read(timeout_ms=1000)
    np.testing.assert_array_equal(first.image, kept)


def test_absent_camera_fails_fast_naming_the_serials():
    camera = RealSenseCamera(RealSenseCameraConfig(serial="000000000000"))
    start = time.monotonic()
    with pytest.raises(DeviceNotFoundError, match="serial '000000000000' is attached; attached: "):
        camera.connect()
    assert time.monotonic() - start < 2.0
    assert not camera.is_connected


def test_a_recording_of_another_size_is_refused(recording):
    camera = RealSenseCamera(RealSenseCameraConfig(width=640, height=480, playback_file=str(recording)))
    with pytest.raises(ValueError, match="the color stream is 64x48, the config asks for width=640, height=480"):
        camera.connect()
    assert not camera.is_connected


def test_features_are_known_while_disconnected():
    camera = RealSenseCamera(RealSenseCameraConfig(serial="123622270136", width=320, height=240))
    assert camera.features == {"image": (240, 320, 3)}
    with pytest.raises(DeviceNotConnectedError):
        camera.read()
    with pytest.raises(DeviceNotConnectedError):
        camera.read_latest()


@pytest.mark.parametrize("kwargs, message", [
    ({}, "serial='': the camera's serial number"),
    ({"serial": "1", "width": 0}, "width=0: a positive integer"),
    ({"serial": "1", "fps": 29.97}, "fps=29.97: a positive integer"),
    ({"playback_file": "old.bag"}, r"a \.db3 recording .*ROS 1 \.bag files are not readable"),
])
def test_config_refuses_bad_values(kwargs, message):
    with pytest.raises(ValueError, match=message):
        RealSenseCameraConfig(**kwargs)


def test_a_file_that_is_not_a_recording_is_named(tmp_path):
    junk = tmp_path / "notes.db3"
    junk.write_bytes(np.random.default_rng(0).integers(0, 256, 5000, dtype=np.uint8).tobytes())
    camera = RealSenseCamera(RealSenseCameraConfig(playback_file=str(junk)))
    with pytest.raises(ValueError, match=r"notes.db3 holds no color stream pyrealsense2 can play: not a RealSense"):
        camera.connect()
    assert not camera.is_connected


def test_missing_recording_is_named(tmp_path):
    camera = RealSenseCamera(RealSenseCameraConfig(playback_file=str(tmp_path / "none.db3")))
    with pytest.raises(FileNotFoundError, match="none.db3"):
        camera.connect()
