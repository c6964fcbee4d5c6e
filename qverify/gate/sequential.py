"""Anytime-valid bounds for open-ended looks, and the budgeted gate's look sizes.

The budgeted gate (qverify.gate.budget) plans its looks in advance and uses group-sequential
boundaries (qverify.gate.boundaries), which are tighter at a planned budget. For looks with no
plan, the asymptotic confidence sequence of Waudby-Smith, Arbour,
Sinha, Kennedy & Ramdas (2021, "Time-uniform central limit theory", Thm 2.2; the
normal-mixture boundary of Howard et al. 2021), as `evalsig`'s sequential_gate does:

    mean(d) -+ sd(d) * sqrt( 2 (n rho^2 + 1) / (n^2 rho^2) * log( sqrt(n rho^2 + 1) / alpha ) )

It is a two-sided (1 - alpha) sequence; its lower and upper ends are used as one-sided
bounds, each then valid at level alpha over all looks at once (conservative by at most
alpha/2). rho tunes where it is tightest: rho^2 = (-2 log alpha + log(-2 log alpha + 1)) / n*,
n* the items the budget can buy. For bounded metrics with few changed items the exact
betting bound (qverify.gate.betting) is taken as well, the wider of the two winning, so
a look can never be narrower than the confidence sequence. p-values for Holm are the
smallest alpha at which the sequence clears the margin; they are anytime-valid too.
"""

from __future__ import annotations

import math

import numpy as np

from qverify.gate.betting import bounds_and_p
from qverify.gate.bounds import Bounds, small_regime


def rho_for(n_star: float, alpha: float) -> float:
    """rho that makes the sequence tightest at n* items (Waudby-Smith et al. 2021, eq. (13))."""
    la = -2 * math.log(alpha)
    return math.sqrt((la + math.log(la + 1)) / max(n_star, 1.0))


def radius(n: np.ndarray | float, alpha: float | np.ndarray, rho: float) -> np.ndarray:
    """Half-width per unit sd after n items."""
    n = np.asarray(n, float)
    r2 = rho * rho
    return np.sqrt(2 * (n * r2 + 1) / (n * n * r2) * np.log(np.sqrt(n * r2 + 1) / np.asarray(alpha)))


def _cs_p(mean: np.ndarray, sd: np.ndarray, n: int, tol: float, rho: float, fail: bool) -> np.ndarray:
    """Smallest alpha at which the sequence's bound clears -tol, by bisection on log alpha."""
    gap = (-(mean + tol)) if fail else (mean + tol)  # how far the centre is past the margin
    lo, hi = np.full(np.shape(mean), -40.0), np.zeros(np.shape(mean))
    for _ in range(40):
        mid = (lo + hi) / 2
        ok = gap > sd * radius(n, np.exp(mid), rho)
        hi, lo = np.where(ok, mid, hi), np.where(ok, lo, mid)
    return np.where(gap > sd * radius(n, 1.0, rho), np.exp(hi), 1.0)


def sequence_bounds(d: np.ndarray, tol: float, alpha: float, n_star: float, bounded: bool = False) -> Bounds:
    """Anytime-valid one-sided bounds for E[d] from the items so far, d oriented higher-is-better, shape (..., n)."""
    d = np.asarray(d, float)
    n = d.shape[-1]
    rho = rho_for(n_star, alpha)
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n > 1 else np.full(mean.shape, np.inf)
    half = sd * radius(n, alpha, rho)
    lo, hi = mean - half, mean + half
    p_pass, p_fail = _cs_p(mean, sd, n, tol, rho, False), _cs_p(mean, sd, n, tol, rho, True)
    exact = np.zeros(mean.shape, bool)
    if bounded:
        exact = small_regime(d)
        if exact.any():  # the betting bound is anytime-valid too: the wider of the two
            elo, ehi, epp, epf = (np.where(exact, x, np.nan) for x in bounds_and_p(d, tol, alpha))
            lo, hi = np.where(exact, np.minimum(lo, elo), lo), np.where(exact, np.maximum(hi, ehi), hi)
            p_pass = np.where(exact, np.maximum(p_pass, epp), p_pass)
            p_fail = np.where(exact, np.maximum(p_fail, epf), p_fail)
    return Bounds(mean, sd / math.sqrt(n), lo, hi, p_pass, p_fail, exact, n)


def look_sizes(first: int, per_round: int, max_items: int) -> list[int]:
    """Items after each look: first, first + per_round, ... up to max_items (the last look is at max_items)."""
    out = list(range(first, max_items + 1, per_round)) if per_round > 0 else [first]
    if not out or out[-1] != max_items:
        out.append(max_items)
    return out
