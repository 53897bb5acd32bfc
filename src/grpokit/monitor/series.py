"""Small statistics on metric series: ranks, Spearman correlation, smoothing, reading a metric."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence


def metric(metrics: Mapping[str, object], key: str) -> float | None:
    """The metric as a finite float, or None when it is absent, not a number, NaN or infinite."""
    value = metrics.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, ties sharing their average rank (as Spearman's correlation needs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def pearson(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Pearson correlation; 0 when either series is constant (no trend to speak of)."""
    if len(xs) != len(ys):
        raise ValueError("series of different lengths")
    n = len(xs)
    if n < 2:
        return 0.0
    mx, my = sum(xs) / n, sum(ys) / n
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx == 0 or syy == 0:
        return 0.0
    return sxy / math.sqrt(sxx * syy)


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (Pearson on average ranks); 0 for a constant series."""
    return pearson(ranks(xs), ranks(ys))


def trend(values: Sequence[float]) -> tuple[float, float, float]:
    """How a window of values moves: (Spearman with position, first-third mean, last-third mean).

    Thirds, not end points, so that one noisy step cannot make or break a trend.
    """
    n = len(values)
    third = max(1, n // 3)
    first = sum(values[:third]) / third
    last = sum(values[-third:]) / third
    return spearman(list(range(n)), list(values)), first, last


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
