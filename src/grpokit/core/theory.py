"""Success amplification under GRPO with a 0/1 reward (Mroueh 2025; docs/math.md section 5).

With p the success probability of the current policy on a prompt, the KL-regularised optimum of
the next iteration has success probability h(p):

    logit(h(p)) = logit(p_ref) + 1 / (beta * sqrt(p (1 - p) + eps))     (std-normalised advantage)
    logit(h(p)) = logit(p_ref) + 1 / beta                                (advantage r - p)

Everything here is plain float arithmetic in logit space: p close to 0 or 1 would lose its
distance to the boundary in probability space (1 - p rounds to 0 long before the logit is
large), while the logit keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["FixedPoint", "fixed_point", "fixed_points", "h", "h_prime", "iterate"]


@dataclass(frozen=True)
class FixedPoint:
    """A fixed point p* = h(p*) in (0, 1).

    p: the fixed point (may round to 1.0 in double precision although it is < 1).
    logit: logit(p), which still tells points apart where p has rounded to 1.
    derivative: h'(p*). stable: |h'(p*)| < 1 (the iteration converges nearby).
    """

    p: float
    logit: float
    derivative: float
    stable: bool


def _sigmoid(x: float) -> float:
    """1 / (1 + e^-x) without overflow for any float x (inf included)."""
    if x >= 0.0:
        return 1.0 / (1.0 + math.exp(-x))
    z = math.exp(x)
    return z / (1.0 + z)


def _variance_from_logit(x: float) -> float:
    """p (1 - p) for p = sigmoid(x), accurate also when p is within 1e-300 of 0 or 1."""
    z = math.exp(-abs(x))
    return z / (1.0 + z) ** 2


def _logit(p: float) -> float:
    if p <= 0.0:
        return -math.inf
    if p >= 1.0:
        return math.inf
    return math.log(p) - math.log1p(-p)


def _check(p_ref: float, beta: float, eps: float) -> None:
    if not 0.0 <= p_ref <= 1.0:
        raise ValueError(f"p_ref must be a probability in [0, 1], got {p_ref!r}")
    if not beta > 0.0:
        raise ValueError(f"beta must be > 0, got {beta!r}")
    if not eps >= 0.0:
        raise ValueError(f"eps must be >= 0, got {eps!r}")


def _check_p(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"p must be a probability in [0, 1], got {p!r}")


def _bonus(variance: float, beta: float, eps: float, std_normalized: bool) -> float:
    """The logit increment 1 / (beta * sqrt(variance + eps)) (or 1 / beta); inf at 0 spread."""
    if not std_normalized:
        return 1.0 / beta
    spread = math.sqrt(variance + eps)
    return math.inf if spread == 0.0 else 1.0 / (beta * spread)


def _next_logit(x: float, c: float, beta: float, eps: float, std_normalized: bool) -> float:
    """logit(h(sigmoid(x))) given c = logit(p_ref) finite."""
    return c + _bonus(_variance_from_logit(x), beta, eps, std_normalized)


def _h_from_variance(
    variance: float, p_ref: float, beta: float, eps: float, std_normalized: bool
) -> float:
    if p_ref in (0.0, 1.0):
        return p_ref
    return _sigmoid(_logit(p_ref) + _bonus(variance, beta, eps, std_normalized))


def h(
    p: float,
    *,
    p_ref: float,
    beta: float,
    eps: float = 1e-6,
    std_normalized: bool = True,
) -> float:
    """Success probability after one GRPO iteration from success probability p.

    p, p_ref in [0, 1]; beta > 0 the KL coefficient; eps >= 0 inside the std. p_ref = 0 gives 0
    (nothing to amplify) and p_ref = 1 gives 1.
    """
    _check(p_ref, beta, eps)
    _check_p(p)
    return _h_from_variance(p * (1.0 - p), p_ref, beta, eps, std_normalized)


def _h_prime_at(
    variance: float,
    one_minus_two_p: float,
    h_variance: float,
    beta: float,
    eps: float,
    std_normalized: bool,
) -> float:
    """h'(p) = -h(1-h)(1-2p) / (2 beta (p(1-p)+eps)^(3/2)), from precomputed pieces."""
    if not std_normalized or h_variance == 0.0:
        # Without std, h is constant; with h(1-h) = 0, h is flat at 0 or 1 (it decays faster
        # than the denominator where the denominator vanishes too).
        return 0.0
    return -h_variance * one_minus_two_p / (2.0 * beta * math.pow(variance + eps, 1.5))


def h_prime(
    p: float,
    *,
    p_ref: float,
    beta: float,
    eps: float = 1e-6,
    std_normalized: bool = True,
) -> float:
    """dh/dp at p (0 without std normalisation, where h is constant). Same arguments as h."""
    _check(p_ref, beta, eps)
    _check_p(p)
    variance = p * (1.0 - p)
    hp = _h_from_variance(variance, p_ref, beta, eps, std_normalized)
    return _h_prime_at(variance, 1.0 - 2.0 * p, hp * (1.0 - hp), beta, eps, std_normalized)


def iterate(
    p_ref: float,
    *,
    beta: float,
    n_steps: int,
    eps: float = 1e-6,
    std_normalized: bool = True,
) -> list[float]:
    """[p_0, p_1, ..., p_n_steps] with p_0 = p_ref and p_{n+1} = h(p_n)."""
    _check(p_ref, beta, eps)
    if isinstance(n_steps, bool) or not isinstance(n_steps, int) or n_steps < 0:
        raise ValueError(f"n_steps must be an integer >= 0, got {n_steps!r}")
    if p_ref in (0.0, 1.0):
        return [p_ref] * (n_steps + 1)
    c = _logit(p_ref)
    x = c
    out = [p_ref]
    for _ in range(n_steps):
        x = _next_logit(x, c, beta, eps, std_normalized)
        out.append(_sigmoid(x))
    return out


def fixed_point(
    p_ref: float,
    *,
    beta: float,
    eps: float = 1e-6,
    std_normalized: bool = True,
    tol: float = 1e-12,
    max_iter: int = 100_000,
) -> float:
    """The limit of p_{n+1} = h(p_n) from p_0 = p_ref: the lowest stable fixed point.

    Stops when two successive p differ by at most ``tol``. Raises RuntimeError if that does not
    happen within ``max_iter`` steps (the iteration oscillates when |h'(p*)| > 1; see
    ``fixed_points`` for the fixed points and their stability).
    """
    _check(p_ref, beta, eps)
    if not tol > 0.0:
        raise ValueError(f"tol must be > 0, got {tol!r}")
    if max_iter < 1:
        raise ValueError(f"max_iter must be >= 1, got {max_iter!r}")
    if p_ref in (0.0, 1.0):
        return p_ref
    c = _logit(p_ref)
    x = c
    p = p_ref
    for _ in range(max_iter):
        x = _next_logit(x, c, beta, eps, std_normalized)
        p_next = _sigmoid(x)
        if abs(p_next - p) <= tol:
            return p_next
        p = p_next
    raise RuntimeError(
        f"h iteration from p_ref={p_ref} (beta={beta}, eps={eps}) did not settle within "
        f"{max_iter} steps (last p={p}); it may oscillate around an unstable fixed point"
    )


def fixed_points(
    p_ref: float,
    *,
    beta: float,
    eps: float = 1e-6,
    std_normalized: bool = True,
    grid_points: int = 20_001,
) -> list[FixedPoint]:
    """All fixed points of h in (0, 1), in increasing order, with h'(p*) and stability.

    Roots of g(x) = logit(p_ref) + 1/(beta sqrt(q(x) + eps)) - x, q(x) = p(1-p) at p = sigmoid(x),
    are bracketed by sign changes on a grid and refined by bisection. Every root lies in
    [logit(p_ref) + 2/(beta sqrt(1 + 4 eps)), logit(p_ref) + 1/(beta sqrt(eps))] because
    q <= 1/4; the grid is dense where q still changes and one interval covers the rest, where g
    is linear. A double root (h tangent to the diagonal, a bifurcation point) has no sign change
    and can be missed. p_ref = 0 or 1 has no fixed point inside (0, 1): h is constant 0 or 1.
    std normalisation needs eps > 0 here.
    """
    _check(p_ref, beta, eps)
    if grid_points < 2:
        raise ValueError(f"grid_points must be >= 2, got {grid_points!r}")
    if p_ref in (0.0, 1.0):
        return []
    c = _logit(p_ref)
    if not std_normalized:
        x = c + 1.0 / beta
        return [FixedPoint(p=_sigmoid(x), logit=x, derivative=0.0, stable=True)]
    if eps <= 0.0:
        raise ValueError(
            "fixed_points with std_normalized=True needs eps > 0 (with eps = 0, h has no "
            "bounded logit range to search); use a small eps such as 1e-6"
        )

    def g(x: float) -> float:
        return _next_logit(x, c, beta, eps, std_normalized) - x

    low = c + 2.0 / (beta * math.sqrt(1.0 + 4.0 * eps))
    high = c + 1.0 / (beta * math.sqrt(eps))
    # Beyond here q(x) < eps * 1e-17, so sqrt(q + eps) == sqrt(eps) in double precision.
    flat_from = max(low, math.log(1.0 / eps) + 40.0)
    dense_end = min(high, flat_from)
    step = (dense_end - low) / (grid_points - 1)
    grid = [low + i * step for i in range(grid_points)]
    if high > dense_end:
        grid.append(high)

    roots: list[float] = []
    values = [g(x) for x in grid]
    for i in range(len(grid) - 1):
        a, b = grid[i], grid[i + 1]
        ga, gb = values[i], values[i + 1]
        if ga == 0.0:
            roots.append(a)
        elif ga * gb < 0.0:
            roots.append(_bisect(g, a, b, ga))
    if values[-1] == 0.0:
        roots.append(grid[-1])

    out = []
    for x in roots:
        p = _sigmoid(x)
        variance = _variance_from_logit(x)
        # 1 - 2p = (1 - p) - p, written with sigmoid(-x) to keep precision near p = 1.
        one_minus_two_p = _sigmoid(-x) - p
        derivative = _h_prime_at(
            variance, one_minus_two_p, _variance_from_logit(x), beta, eps, std_normalized
        )
        out.append(FixedPoint(p=p, logit=x, derivative=derivative, stable=abs(derivative) < 1.0))
    return out


def _bisect(g: Callable[[float], float], a: float, b: float, ga: float) -> float:
    """Root of g in [a, b] where g(a) = ga and g(b) have opposite signs, to float resolution."""
    for _ in range(200):
        mid = 0.5 * (a + b)
        if mid in (a, b):
            break
        gm = g(mid)
        if gm == 0.0:
            return mid
        if (gm < 0.0) == (ga < 0.0):
            a, ga = mid, gm
        else:
            b = mid
    return 0.5 * (a + b)
