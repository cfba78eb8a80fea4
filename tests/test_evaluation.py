"""The success-rate interval that ``vla-eval`` reports next to success_once."""

from __future__ import annotations

import pytest

from vla_trainer.evaluation import wilson_interval


@pytest.mark.parametrize("successes,trials,expected", [
    (0, 32, (0.0, 3.8416 / 35.8416)),   # z^2 / (n + z^2): 0 of 32 still allows about 11 %
    (32, 32, (32 / 35.8416, 1.0)),
    (16, 32, (0.3363, 0.6637)),          # centre 0.5, half-width 1.96 * 0.09354 / 1.12005
])
def test_wilson_interval_matches_hand_computed_values(successes, trials, expected):
    low, high = wilson_interval(successes, trials)
    assert (low, high) == pytest.approx(expected, abs=1e-4)


def test_wilson_interval_narrows_with_more_episodes_and_contains_the_rate():
    for successes, trials in [(3, 32), (12, 128)]:
        low, high = wilson_interval(successes, trials)
        assert low < successes / trials < high
    assert wilson_interval(12, 128)[1] - wilson_interval(12, 128)[0] < wilson_interval(3, 32)[1] - wilson_interval(3, 32)[0]


@pytest.mark.parametrize("successes,trials", [(5, 4), (-1, 4), (0, 0)])
def test_wilson_interval_rejects_impossible_counts(successes, trials):
    with pytest.raises(ValueError, match="successes=.*trials="):
        wilson_interval(successes, trials)
