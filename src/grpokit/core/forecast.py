"""The success-amplification forecast (docs/math.md section 5) for a measured pass rate.

For a reward checked as pass / fail (a 0/1 reward, or any reward made binary by "at its
maximum"), the KL-regularised GRPO optimum iterated from the base model's success probability
p_ref converges to a fixed point p* of h (``grpokit.core.theory``). That p* is the idealised
optimum of the objective, not a promise of what a finite run reaches: it assumes the optimum is
attained at every iteration, and it is a per-prompt quantity applied here to the pooled rate.

beta = 0 makes the optimum degenerate: without a KL term the exponent 1/beta is infinite, so
p* = 1 whenever p_ref > 0 (and 0 when p_ref = 0). The functions return that limit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from grpokit.core.theory import fixed_point, fixed_points

__all__ = [
    "FORECAST_EPS",
    "Forecast",
    "ForecastCheck",
    "forecast",
    "forecast_checks",
    "forecast_for_reward",
    "std_normalized_for",
]

FORECAST_EPS = 1e-6
"""eps inside sqrt(p(1-p) + eps), as in docs/math.md's worked values; p* barely depends on it."""


def std_normalized_for(scale_rewards: str) -> bool:
    """Whether a `training.scale_rewards` setting divides advantages by a std.

    "batch" divides by the batch std; for the forecast, whose theory is per prompt, it is treated
    as std normalisation (exact when every prompt has the same pass rate).
    """
    return scale_rewards != "none"


def forecast_for_reward(pass_rate: float, *, beta: float, std_normalized: bool) -> float | None:
    """The fixed point p* reached from p_ref = pass_rate, or None without a usable pass rate.

    pass_rate: measured share of samples at the reward's maximum, in [0, 1]; NaN gives None.
    beta: the KL coefficient (>= 0); 0 gives the degenerate limit (1.0 if pass_rate > 0, else 0).
    std_normalized: whether advantages are divided by the std (scale_rewards group/batch).
    """
    if math.isnan(pass_rate):
        return None
    if not 0.0 <= pass_rate <= 1.0:
        raise ValueError(f"pass_rate must be in [0, 1], got {pass_rate!r}")
    if beta < 0.0:
        raise ValueError(f"beta must be >= 0, got {beta!r}")
    if pass_rate in (0.0, 1.0):
        return pass_rate
    if beta == 0.0:
        return 1.0
    try:
        return fixed_point(pass_rate, beta=beta, eps=FORECAST_EPS, std_normalized=std_normalized)
    except RuntimeError:
        # The iteration oscillates around an unstable point: the lowest stable fixed point is
        # the best idealised answer, and if there is none the forecast is undefined.
        stable = [
            fp.p
            for fp in fixed_points(
                pass_rate, beta=beta, eps=FORECAST_EPS, std_normalized=std_normalized
            )
            if fp.stable
        ]
        return stable[0] if stable else None


@dataclass(frozen=True)
class Forecast:
    """The forecast for one reward, from its measured pass rate and its Wilson interval.

    p_star: forecast under the configured advantage scaling; p_star_low / p_star_high: the same
    at the interval's ends (p* grows with p_ref, so these bound it); with_std / without_std: p*
    with and without std normalisation (one of them equals p_star).
    """

    p_ref: float
    beta: float
    std_normalized: bool
    p_star: float | None
    p_star_low: float | None
    p_star_high: float | None
    with_std: float | None
    without_std: float | None

    @property
    def degenerate(self) -> bool:
        """beta = 0: no KL term, the optimum puts all mass on successes."""
        return self.beta == 0.0


def forecast(
    p_ref: float, interval: tuple[float, float], *, beta: float, std_normalized: bool
) -> Forecast:
    """The forecast at p_ref and at both ends of its interval (low, high)."""
    low, high = interval
    with_std = forecast_for_reward(p_ref, beta=beta, std_normalized=True)
    without_std = forecast_for_reward(p_ref, beta=beta, std_normalized=False)
    return Forecast(
        p_ref=p_ref,
        beta=beta,
        std_normalized=std_normalized,
        p_star=with_std if std_normalized else without_std,
        p_star_low=forecast_for_reward(low, beta=beta, std_normalized=std_normalized),
        p_star_high=forecast_for_reward(high, beta=beta, std_normalized=std_normalized),
        with_std=with_std,
        without_std=without_std,
    )


@dataclass(frozen=True)
class ForecastCheck:
    """One reward's (or checklist item's) forecast held against what the run measured."""

    name: str
    """The reward's name, or a reward part's (``checklist/<item>``)."""
    p_ref: float | None
    """The training pass rate the forecast started from (the forecast's step)."""
    forecast: float
    """p*, the forecast pass rate."""
    heldout_first: float | None
    """The first held-out pass rate logged (None without held-out checks)."""
    heldout_last: float | None
    """The last held-out pass rate logged."""
    heldout_step: int | None
    """The step of ``heldout_last``."""

    @property
    def shortfall(self) -> float | None:
        """forecast - last held-out pass rate (positive: the run stopped short of p*)."""
        return None if self.heldout_last is None else self.forecast - self.heldout_last


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return float(value)


def forecast_checks(rows: Sequence[Mapping[str, Any]]) -> list[ForecastCheck]:
    """Every forecast a run logged (``forecast/<name>/pass_rate``, first value) with the pass
    rate it started from (``pass_rate/<name>``, or ``<name>/pass_rate`` for a reward part, in
    the same row) and the held-out pass rates (``eval/<name>/pass_rate``), first and last.

    rows: the run's metric rows in step order (each may hold ``step``).
    """
    found: dict[str, ForecastCheck] = {}
    for row in rows:
        for key, value in row.items():
            if not (key.startswith("forecast/") and key.endswith("/pass_rate")):
                continue
            name = key[len("forecast/") : -len("/pass_rate")]
            p_star = _number(value)
            if name in found or not name or p_star is None:
                continue
            p_ref = _number(row.get(f"pass_rate/{name}"))
            if p_ref is None:
                p_ref = _number(row.get(f"{name}/pass_rate"))
            found[name] = ForecastCheck(name, p_ref, p_star, None, None, None)
    out = []
    for name, check in found.items():
        held = [
            (row.get("step"), v)
            for row in rows
            if (v := _number(row.get(f"eval/{name}/pass_rate"))) is not None
        ]
        if held:
            step = held[-1][0]
            check = ForecastCheck(
                name,
                check.p_ref,
                check.forecast,
                held[0][1],
                held[-1][1],
                step if isinstance(step, int) and not isinstance(step, bool) else None,
            )
        out.append(check)
    return out
