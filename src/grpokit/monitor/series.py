"""Small statistics on metric series: trend (rank correlation with time), smoothing, reading
a metric, step-to-step noise, level shifts measured against it and the level of the monitors'
tests."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from grpokit.core.stats import spearman
from grpokit.monitor.config import MonitorConfig


def metric(metrics: Mapping[str, object], key: str) -> float | None:
    """The metric as a finite float, or None when it is absent, not a number, NaN or infinite."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def trend(values: Sequence[float]) -> float:
    """Spearman correlation of ``values`` with their order: +1 for a series that only rises, -1
    for one that only falls. A constant series (or a single point) has no trend: 0, where the
    correlation itself is undefined (:func:`~grpokit.core.stats.spearman` gives NaN)."""
    rho = spearman(range(len(values)), values)
    return 0.0 if math.isnan(rho) else rho


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values)


def median(values: Sequence[float]) -> float:
    s = sorted(values)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else (s[mid - 1] + s[mid]) / 2


def ema(values: Sequence[float | None], alpha: float) -> list[float | None]:
    """Exponential moving average with bias correction, skipping (and keeping) missing values.

    ``alpha`` is the weight of history (TensorBoard's smoothing slider); 0 returns the input.
    """
    if not 0 <= alpha < 1:
        raise ValueError(f"alpha must be in [0, 1), got {alpha}")
    out: list[float | None] = []
    acc, weight = 0.0, 0.0
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(None)
            continue
        acc = alpha * acc + (1 - alpha) * v
        weight = alpha * weight + (1 - alpha)
        out.append(acc / weight)
    return out


def step_noise(values: Sequence[float]) -> tuple[float, int] | None:
    """A series' step-to-step noise around its trend: (sigma, degrees of freedom).

    The residual standard deviation about the least-squares line through the values (steps
    0, 1, ...), with n - 2 degrees of freedom: a run that is learning moves its metrics along a
    trend, which is not noise. None with fewer than 3 values.
    """
    n = len(values)
    if n < 3:
        return None
    xm, ym = (n - 1) / 2, mean(values)
    sxx = n * (n * n - 1) / 12  # sum of (i - xm)^2 over i = 0 .. n-1
    sxy = math.fsum((i - xm) * (y - ym) for i, y in enumerate(values))
    syy = math.fsum((y - ym) ** 2 for y in values)
    rss = max(0.0, syy - sxy * sxy / sxx)
    return math.sqrt(rss / (n - 2)), n - 2


@dataclass(frozen=True)
class Shift:
    """The change of a metric's level between two windows of steps, against its noise."""

    before: float
    """Mean of the earlier window."""
    after: float
    """Mean of the later window."""
    t: float
    """(after - before) / (sigma sqrt(1/n_before + 1/n_after)); +-inf without noise."""
    df: int
    """Degrees of freedom of sigma (see :func:`step_noise`)."""

    @property
    def diff(self) -> float:
        return self.after - self.before


def shift(before: Sequence[float], after: Sequence[float], noise: Sequence[float]) -> Shift | None:
    """How far the mean moved from window ``before`` to window ``after``, in standard errors.

    ``noise``: the series up to the start of ``after`` (its last steps), whose
    :func:`step_noise` gives sigma. Measured before the change, the noise is not widened by the
    change itself, and under no change (independent normal noise) the statistic follows
    Student's t with the noise's degrees of freedom. None when either window is empty or the noise has fewer than 3 values. A series
    without noise gives t = +-inf for any change, 0 for none: a rule's own minimum effect then
    decides alone.
    """
    est = step_noise(noise)
    if not before or not after or est is None:
        return None
    sigma, df = est
    b, a = mean(before), mean(after)
    se = sigma * math.sqrt(1 / len(before) + 1 / len(after))
    if se > 0:
        t = (a - b) / se
    elif a == b:
        t = 0.0
    else:
        t = math.copysign(math.inf, a - b)
    return Shift(b, a, t, df)


@dataclass(frozen=True)
class ChangeTest:
    """The significance level of every change rule's check, from a per-run false-alarm target.

    A rule checks at every step, so each check is a one-sided test at
    ``false_alarm_rate / horizon_steps`` (divided again among the ``tests`` a rule runs per
    check): by Bonferroni's inequality the chance that a rule fires at least once in
    ``horizon_steps`` steps of stationary noise is at most ``false_alarm_rate`` (less in practice:
    the checks' windows overlap, so their errors are not independent).
    """

    false_alarm_rate: float
    horizon_steps: int
    noise_window: int
    """Steps before a tested window whose scatter about their trend gives a metric's noise."""
    tests: int = 1
    """Tests per check of one rule (a rule that watches two metrics runs two)."""

    @classmethod
    def of(cls, config: MonitorConfig | None = None) -> ChangeTest:
        """The settings of a monitors config (the defaults without one)."""
        c = config or MonitorConfig()
        return cls(c.false_alarm_rate, c.horizon_steps, c.noise_window)

    @property
    def alpha(self) -> float:
        """Level of one test."""
        return self.false_alarm_rate / self.horizon_steps / self.tests

    def split(self, tests: int) -> ChangeTest:
        """The same target shared by ``tests`` tests per check."""
        return replace(self, tests=self.tests * max(1, tests))

    def critical(self, df: int) -> float:
        """The t a shift must pass (one-sided) with df degrees of freedom in its noise."""
        # Imported here: grpokit.core pulls in torch, and the config loads monitor/ without it.
        from grpokit.core.stats import student_t_quantile

        return student_t_quantile(1.0 - self.alpha, df)

    def rose(self, s: Shift | None) -> bool:
        return s is not None and s.t >= self.critical(s.df)

    def fell(self, s: Shift | None) -> bool:
        return s is not None and -s.t >= self.critical(s.df)

    def evidence(self, s: Shift) -> str:
        """The test in words: 't = -5.2 on 32 df beyond 4.4, the bar for 1% false alarms ...'."""
        bar = f"the bar for {self.false_alarm_rate:.2g} false alarms per {self.horizon_steps} steps"
        if math.isinf(s.t):
            return f"no step-to-step noise at all, so any change passes {bar}"
        return f"t = {s.t:+.1f} on {s.df} df beyond {self.critical(s.df):.1f}, {bar}"

    def buffer(self, after: int = 0) -> deque[float]:
        """A buffer of a metric's last values: the noise window and the ``after`` window."""
        return deque(maxlen=self.noise_window + after)
