"""Preflight: will a GRPO run learn at all? Measure before spending the compute.

``grpokit preflight CONFIG`` samples groups with the configured model, sampling settings and
rewards (through the trainer's own ``sample_and_score``), reports pass rates with Wilson
intervals, the share of groups with equal rewards (no gradient), parse failures, gates and
lengths, forecasts the reachable pass rate (success amplification, docs math section 5) and
gives a verdict with advice. ``grpokit theory`` prints and plots the forecast's iteration.

Only light modules are imported here; the sampling parts load torch models on use.
"""

from __future__ import annotations

from grpokit.core.forecast import Forecast, forecast, forecast_for_reward

__all__ = ["Forecast", "forecast", "forecast_for_reward"]
