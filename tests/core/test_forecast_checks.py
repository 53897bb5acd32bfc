"""forecast_checks: each logged forecast with the pass rate it started from and the held-out
pass rates it is held against, for rewards and for reward parts (checklist items)."""

from __future__ import annotations

import pytest

from grpokit.core.forecast import ForecastCheck, forecast_checks


def test_forecasts_are_paired_with_their_start_and_heldout_rates() -> None:
    rows = [
        {
            "step": 1,
            "pass_rate/fmt": 0.25,
            "forecast/fmt/pass_rate": 0.8,
            "checklist/price/pass_rate": 0.5,
            "forecast/checklist/price/pass_rate": 0.9,
            "eval/fmt/pass_rate": 0.2,
        },
        {"step": 2, "forecast/fmt/pass_rate": 0.1},  # only the first forecast counts
        {"step": 3, "eval/fmt/pass_rate": 0.6, "eval/checklist/price/pass_rate": 0.7},
        {"step": 4, "eval/fmt/pass_rate": float("nan")},  # not a measurement
    ]
    checks = {c.name: c for c in forecast_checks(rows)}
    assert checks["fmt"] == ForecastCheck("fmt", 0.25, 0.8, 0.2, 0.6, 3)
    assert checks["checklist/price"] == ForecastCheck("checklist/price", 0.5, 0.9, 0.7, 0.7, 3)
    assert checks["fmt"].shortfall == pytest.approx(0.2)


def test_without_heldout_checks_the_forecast_stands_alone() -> None:
    (check,) = forecast_checks([{"forecast/x/pass_rate": 0.4}, {"reward": 1.0}])
    assert check == ForecastCheck("x", None, 0.4, None, None, None)
    assert check.shortfall is None
    assert forecast_checks([{"reward": 1.0}]) == []
