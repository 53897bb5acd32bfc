"""forecast_for_reward against math.md section 5's worked values, and its edge cases."""

from __future__ import annotations

import math

import pytest

from grpokit.core.forecast import forecast, forecast_for_reward, std_normalized_for


def test_worked_values() -> None:
    assert forecast_for_reward(0.2, beta=1.0, std_normalized=True) == pytest.approx(
        0.6812992, abs=5e-8
    )
    assert forecast_for_reward(0.2, beta=1.0, std_normalized=False) == pytest.approx(
        0.40461, abs=5e-6
    )
    assert forecast_for_reward(0.2, beta=0.1, std_normalized=True) == 1.0


def test_edges() -> None:
    # Nothing to amplify, nothing left to gain, degenerate beta = 0, no measurement.
    assert forecast_for_reward(0.0, beta=0.04, std_normalized=True) == 0.0
    assert forecast_for_reward(1.0, beta=0.04, std_normalized=True) == 1.0
    assert forecast_for_reward(0.05, beta=0.0, std_normalized=True) == 1.0
    assert forecast_for_reward(0.0, beta=0.0, std_normalized=True) == 0.0
    assert forecast_for_reward(math.nan, beta=0.04, std_normalized=True) is None
    with pytest.raises(ValueError):
        forecast_for_reward(1.5, beta=0.04, std_normalized=True)
    with pytest.raises(ValueError):
        forecast_for_reward(0.5, beta=-1.0, std_normalized=True)


def test_forecast_record() -> None:
    fc = forecast(0.2, (0.1, 0.3), beta=1.0, std_normalized=False)
    assert fc.p_star == fc.without_std == pytest.approx(0.40461, abs=5e-6)
    assert fc.with_std == pytest.approx(0.6812992, abs=5e-8)
    # Without std, logit p* = logit p_ref + 1/beta: sigmoid(logit(0.1) + 1) = 0.2319693.
    assert fc.p_star_low == pytest.approx(0.2319693, abs=1e-7)
    assert fc.p_star_high is not None and fc.p_star_high > fc.p_star
    assert not fc.degenerate and forecast(0.2, (0.1, 0.3), beta=0.0, std_normalized=True).degenerate


def test_scale_rewards_mapping() -> None:
    assert std_normalized_for("group") and std_normalized_for("batch")
    assert not std_normalized_for("none")
