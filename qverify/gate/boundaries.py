"""Group-sequential boundaries: the nominal level of each planned look from an alpha-spending function.

The gate looks after each round at cumulative items n_1 < ... < n_J planned in advance, so the
information fractions t_j = n_j / n_J are known. The look statistics Z_j (the standardised
distance of Delta's estimate from the margin) are asymptotically those of a Brownian motion
observed at t_j: S_j = Z_j sqrt(t_j) has independent N(0, t_j - t_{j-1}) increments at the
margin, i.e. corr(Z_i, Z_j) = sqrt(t_i / t_j). A one-sided test that rejects at the first look
with Z_j >= c_j has level alpha if, look by look (Lan & DeMets 1983),

    P(Z_1 < c_1, ..., Z_{j-1} < c_{j-1}, Z_j >= c_j) = f(t_j) - f(t_{j-1}),   f(1) = alpha,

f the spending function. Solving this for c_j needs the joint law of the looks, not just each
look's own: the union bound (spending increments used as per-look levels) ignores that the looks
share their items and is conservative; the nominal levels 1 - Phi(c_j) here are larger than the
increments, and sum to more than alpha while the chance of any crossing stays alpha.

The crossing probabilities are computed by the recursive numerical integration of Armitage,
McPherson & Rowe (1969) / Jennison & Turnbull (2000, ch. 19), the method of gsDesign and rpact:
the sub-density of S_j on the continuation region is carried on a grid and convolved with the next
increment's normal density. Hand-written (~40 lines) because no maintained Python package does
this: `gsdesign` 0.1.5 on PyPI is an alpha port of gsDesign's grid primitives with no spending
or boundary solver. Checked against scipy.stats.multivariate_normal.cdf and against Pocock's and
O'Brien & Fleming's published constants (tests/gate/test_boundaries.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
from scipy import optimize
from scipy import stats as sps

# Hwang, Shih & DeCani (1990) spending f(t) = alpha (1 - e^{-g t}) / (1 - e^{-g}): g = 1 is Pocock-like
# (spends early), g = -4 O'Brien-Fleming-like (keeps alpha for the last look). The gate's value was chosen
# by the operating characteristic (benchmarks/gate_oc.py, docs/gate.md): most of a gate's suites are
# decided at the first looks (stable, ceiling, distance metrics) and a Pocock-like spending lets them.
SPEND_GAMMA = 1.0
_GRID = 0.01  # grid step on the S scale (in units of sqrt(t_J)); halving it moves the levels < 1e-4 relative


def spending(t: np.ndarray | float, alpha: float, gamma: float = SPEND_GAMMA) -> np.ndarray:
    """Alpha spent by information fraction t (Hwang-Shih-DeCani); gamma = 0 is linear, alpha t."""
    t = np.clip(np.asarray(t, float), 0.0, 1.0)
    if abs(gamma) < 1e-9:
        return alpha * t
    return alpha * np.expm1(-gamma * t) / math.expm1(-gamma)


def _cross(c: float, t: float, step: float, grid: np.ndarray | None, dens: np.ndarray | None, h: float) -> float:
    """P(S crosses c sqrt(t) at this look and not before), from the sub-density carried on the grid."""
    if grid is None:
        return float(sps.norm.sf(c))
    return float(np.sum(dens * sps.norm.sf((c * math.sqrt(t) - grid) / step)) * h)


def _looks(fractions, crit_or_increments, solve: bool) -> list[float]:
    """Walk the looks carrying the sub-density of S on the continuation region (-inf, c_j sqrt(t_j)).

    solve=False: crit_or_increments are the c_j; returns P(first crossing at look j).
    solve=True: they are the spending increments; returns the c_j that spend them exactly.
    """
    out: list[float] = []
    grid = dens = None
    h = t_prev = 0.0
    for t, v in zip(fractions, crit_or_increments):
        step = math.sqrt(t - t_prev)
        args = (t, step, grid, dens, h)
        if not solve:
            c = v
            out.append(_cross(c, *args))
        else:
            if v <= 0:
                c = math.inf
            elif grid is None:  # the first look crosses alone: its level is its spending, exactly (a one-look plan is
                c = float(sps.norm.isf(v))  # the fixed gate at alpha, and Holm's alpha / k)
            else:
                c = optimize.brentq(lambda z, a=args, v=v: _cross(z, *a) - v, -1.0, 40.0, xtol=1e-9)
            out.append(c)
        lo, b = -8.0 * math.sqrt(t), min(c, 10.0) * math.sqrt(t)
        cells = max(math.ceil((b - lo) / _GRID), 2)
        x = lo + (np.arange(cells) + 0.5) * ((b - lo) / cells)  # midpoints of the continuation region
        if grid is None:
            dens = sps.norm.pdf(x / step) / step
        else:
            dens = sps.norm.pdf((x[:, None] - grid[None, :]) / step) @ dens * (h / step)
        grid, h, t_prev = x, (b - lo) / cells, t
    return out


def crossing_probabilities(fractions: list[float] | tuple[float, ...], crit: list[float]) -> list[float]:
    """P(first crossing at look j) of Z_j >= crit[j], for Brownian motion at the margin (no drift)."""
    return _looks(fractions, crit, solve=False)


@lru_cache(maxsize=512)
def nominal_levels(fractions: tuple[float, ...], alpha: float, gamma: float = SPEND_GAMMA) -> tuple[float, ...]:
    """Each look's nominal one-sided level 1 - Phi(c_j): the fixed-sample bound at that level is the
    group-sequential boundary. Looks are solved in order, each for its spending increment."""
    spent = spending(np.asarray(fractions, float) / fractions[-1], alpha, gamma)
    incr = np.diff(np.concatenate([[0.0], spent]))
    fr = tuple(float(f) / fractions[-1] for f in fractions)
    return tuple(float(sps.norm.sf(c)) for c in _looks(fr, list(incr), solve=True))


@dataclass(frozen=True)
class LookLevels:
    """What look `look` of a planned sequence tests at (used by qverify.gate.rule.decide).

    Each metric's PASS test (H0: Delta <= -tol) and FAIL test (H0: Delta >= -tol) is its own one-sided
    group-sequential test; neither boundary is computed with the other's stopping in mind, and a metric
    that stops for one reason is never tested for the other again. Such stopping only removes later
    chances to cross, so it can only lower each test's error (the boundaries are "non-binding").
    FAIL is family-wise over the build's gated metrics: Holm's step-down, where the r-th smallest p
    among k untested-so-far hypotheses is compared with the group-sequential level of a test at total
    alpha / k (the sequential Holm of Ye, Li, Jiang & Wang 2013 / Maurer & Bretz 2013, without re-testing
    earlier looks, which only rejects less). The family is every gated metric of the build at look 1,
    PASSed ones included, so it never shrinks by anything but a FAIL.
    """

    fractions: tuple[float, ...]  # planned cumulative items at each look (any common scale)
    look: int  # 1-based
    alpha: float
    gamma: float = SPEND_GAMMA
    family: dict[str, int] = field(default_factory=dict)  # build id -> its gated metrics at look 1

    @property
    def pass_level(self) -> float:
        return nominal_levels(self.fractions, self.alpha, self.gamma)[self.look - 1]

    def fail_level(self, k: int) -> float:
        """The nominal level at this look of one FAIL test within a family of k (total alpha / k)."""
        return nominal_levels(self.fractions, self.alpha / max(k, 1), self.gamma)[self.look - 1]
