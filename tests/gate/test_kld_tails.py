"""kld/kld under heavy-tailed per-item KL (issue 29): the capped KL's exact bound holds its level where the t bound
on the raw KL PASSed 0.061-0.130 at excess = tol. 10,000 trials per rate compared with 5% (limit alpha + 3 SE)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from qverify.gate.rule import Evidence, measure
from qverify.suites.kld import KLD_CAP

TOL, SELF, TRIALS = 0.01, 0.002, 10_000
LIMIT = 0.05 + 3 * np.sqrt(0.05 * 0.95 / TRIALS)


def draw(family: str, shape: float, mean: float, size, rng: np.random.Generator) -> np.ndarray:
    if family == "lognormal":
        return rng.lognormal(np.log(mean) - shape ** 2 / 2, shape, size)
    return rng.pareto(shape, size) * mean * (shape - 1)  # Lomax: tail index `shape`, mean `mean`


@functools.lru_cache(maxsize=None)
def calibrated_mean(family: str, shape: float, excess: float) -> float:
    """The candidate's raw mean KL whose capped mean exceeds the baseline's capped own KL by `excess` (bisection on
    1M draws)."""
    rng = np.random.default_rng(0)
    base = np.minimum(rng.gamma(0.5, SELF / 0.5, 1_000_000), KLD_CAP).mean()
    lo, hi = SELF / 10, 100 * TOL
    for _ in range(22):
        mid = (lo + hi) / 2
        capped = np.minimum(draw(family, shape, mid, 1_000_000, np.random.default_rng(1)), KLD_CAP).mean()
        lo, hi = (mid, hi) if capped - base < excess else (lo, mid)
    return (lo + hi) / 2


def pass_rate(family: str, shape: float, excess: float, n: int, seed: int, exact: bool = True) -> float:
    """P(PASS) of kld/kld as the gate measures it (capped per item, rule.measure), per-item own KL Gamma(0.5)."""
    rng = np.random.default_rng(seed)
    m = calibrated_mean(family, shape, excess)
    own = np.minimum(rng.gamma(0.5, SELF / 0.5, (TRIALS, n)), KLD_CAP)
    cand = np.minimum(draw(family, shape, m, (TRIALS, n), rng), KLD_CAP)
    ev = Evidence("kld/kld", "lower", TOL, cand - own, bounded=True, scale=KLD_CAP, always_exact=exact)
    b = measure(ev, 0.05)  # d holds TRIALS samples of n items: the bounds are vectorised over the first axis
    return float(np.mean(b.lower > -TOL))  # oriented higher-is-better (d negated): PASS when the lower bound clears -tol


@pytest.mark.parametrize("family,shape,n", [("lognormal", 1.0, 24), ("lognormal", 2.0, 24), ("pareto", 2.5, 24),
                                            ("pareto", 3.5, 24), ("lognormal", 2.0, 100), ("pareto", 2.5, 300)])
def test_heavy_tailed_kl_at_the_tolerance_rarely_passes(family, shape, n):
    """With the t bound on the same capped KL (exact=False) the 24-item rows PASS 0.08-0.11: the test fails."""
    assert pass_rate(family, shape, TOL, n, seed=n) <= LIMIT


@pytest.mark.parametrize("family,shape", [("lognormal", 2.0), ("pareto", 2.5)])
def test_an_unchanged_heavy_tailed_build_passes_at_100_items(family, shape):
    assert pass_rate(family, shape, 0.0, 100, seed=7) >= 0.9
