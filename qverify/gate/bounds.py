"""One-sided (1 - alpha) bounds on a paired mean difference, vectorised over leading axes.

`d` holds per-item paired differences, oriented so that higher is better, shape (..., n):
item i's candidate mean minus its baseline mean over the replicates (replicate k of an item
shares a seed on both builds, so the item mean difference already carries the coupling; the
items are the clusters). Two bounds are combined:

* the t bound  mean(d) -+ t_{1-alpha, n-1} * sd(d)/sqrt(n)   (Miller 2024: clustered SE),
  with Hall's (1992) skewness correction, the skewness estimated at the margin (see t_bounds);
* for metrics bounded in [0, 1], when fewer than CLT_MIN_DISCORDANT items changed at all, the
  t bound's normal approximation is not trusted and an exact bound replaces it: one bet on the
  mean of d_i in [-1, 1] (qverify.gate.betting, Waudby-Smith & Ramdas 2023), valid for any item
  law, in which a gain on one item cancels a loss on another. (The rule before took Clopper-Pearson
  bounds of the gains and of the losses separately, each at alpha/2, and the wider of that and the
  t bound: it paid twice for noise that cancels, and at 40 items x 3 replicates, tol 0.10, an
  unchanged build PASSed 8% of the time; issue 29.)

The same bounds are the tests: PASS (non-inferiority) when lower > -tol, FAIL when
upper < -tol; p_pass / p_fail are the matching one-sided p-values (for Holm).
scipy.stats' t quantiles are used; beyond the algebra, only the exponential tilt's
solve is hand-written (tilted_skewness: a damped Newton step on every sample at once; scipy.optimize's
vectorised newton has no step limit, and an undamped step overshoots when the margin is near the
sample's edge).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from qverify.config import ALPHA  # the one default (config.py)
from qverify.gate.betting import bounds_and_p

# Below this many changed items the t bound's normal approximation is not trusted alone
# (a Wald-type bound on a rate near 0 under-covers); checked by benchmarks/gate_oc.py.
CLT_MIN_DISCORDANT = 20
_TILT_STEP = 16.0  # converges in <= 12 steps on the gate's differences, 0/1 and KL alike (checked to 1e-6)


def small_regime(d: np.ndarray) -> np.ndarray:
    """Fewer than CLT_MIN_DISCORDANT items changed: the exact (betting) bound decides instead of the t bound."""
    return (np.asarray(d) != 0).sum(axis=-1) < CLT_MIN_DISCORDANT


@dataclass(frozen=True)
class Bounds:
    delta: np.ndarray  # mean(d)
    se: np.ndarray  # sd(d)/sqrt(n), items as clusters
    lower: np.ndarray  # one-sided (1 - alpha) lower bound of delta
    upper: np.ndarray  # one-sided (1 - alpha) upper bound of delta
    p_pass: np.ndarray  # p-value of H0 "delta <= -tol" (small: non-inferior)
    p_fail: np.ndarray  # p-value of H0 "delta >= -tol" (small: worse than the tolerance)
    exact: np.ndarray  # bool: the exact (betting) bound decided, not the t bound
    n: int
    df: np.ndarray | float = np.inf  # the t bound's degrees of freedom (Satterthwaite, _hall)
    error_cost: tuple[float, float] | None = None  # errored requests at their worst / best (qverify.gate.errored):
    # how far they moved the lower bound down and the upper bound up, against the bounds on the answered requests


def tilted_skewness(d: np.ndarray, mu0: float, iters: int = 12) -> np.ndarray:
    """Skewness of the sample exponentially tilted to mean mu0: weights w_i ~ exp(lam d_i), lam solving
    sum w_i d_i = mu0 (Newton), the least favourable distribution on the sample's points with that mean
    (Efron 1981; DiCiccio & Romano 1990). NaN where mu0 is not strictly inside (min d, max d): no such tilt.

    Why: Hall's correction needs the skewness of d under the hypothesis tested (Delta = -tol), and the
    plain sample skewness is a poor stand-in when d is mostly zeros (excess kurtosis k of 5-70): it moves
    with the sample mean, cov(g, W) ~ (k - 1.5 g^2)/sqrt(n), so in the tail where a test rejects it is about
    twice the truth on one side and near zero on the other (benchmarks/gate_t_accuracy.py), an O(k/n) error
    that made the corrected bound FAIL ~5.4% and PASS ~5.3% at the margin. Tilting the sample to the margin
    takes out that dependence: to first order the tilt moves g by -(k - 1.5 g^2) W / sqrt(n).
    """
    d = np.asarray(d, float)
    m, v = d.mean(axis=-1), d.var(axis=-1)
    lo, hi = d.min(axis=-1), d.max(axis=-1)
    inside = (mu0 > lo) & (mu0 < hi)
    lam = np.where(inside & (v > 0), (mu0 - m) / np.where(v > 0, v, 1.0), 0.0)

    def weights(lam: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        top = np.where(lam > 0, lam * hi, lam * lo)  # max_i lam d_i, so exp never overflows
        w = np.exp(lam[..., None] * d - top[..., None])
        w /= w.sum(axis=-1, keepdims=True)
        mt = (w * d).sum(axis=-1)
        return w, mt, np.maximum((w * d * d).sum(axis=-1) - mt * mt, 0.0)

    step = _TILT_STEP / np.maximum(hi - lo, 1e-12)  # damped Newton: one step changes a weight ratio <= e^16
    for _ in range(iters):  # the tilted mean is increasing in lam (its derivative is the tilted variance)
        _, mt, vt = weights(lam)
        lam = np.where(inside, lam + np.clip((mu0 - mt) / np.maximum(vt, 1e-12), -step, step), 0.0)
    w, mt, vt = weights(lam)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = (w * (d - mt[..., None]) ** 3).sum(axis=-1) / vt ** 1.5
    return np.where(inside & (vt > 0), g, np.nan)


def _hall(d: np.ndarray, null: float | None = None
          ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mean, SE, Hall's (1992) skewness coefficients a = g/(3 sqrt n), b = g/(6 sqrt n), and the degrees of
    freedom of the SE: n - 1 for normal d, fewer for heavy-tailed d (Var s^2 = s^4 (2/(n-1) + kurt/n),
    matched to a chi-square's 2/df: Satterthwaite's rule). Paired item differences are mostly zeros with a
    few large values, so their excess kurtosis is large.

    g is the skewness of the sample tilted to mean `null` (the Delta under test, tilted_skewness); the
    sample's own skewness where no tilt exists or null is None. It is capped at (n-2)/sqrt(n-1), the most
    any n equally weighted points can have, so that Hall's transform stays a small correction."""
    n = d.shape[-1]
    mean = d.mean(axis=-1)
    sd = d.std(axis=-1, ddof=1) if n > 1 else np.full(mean.shape, np.inf)
    c = d - mean[..., None]
    m3, m4 = (c ** 3).mean(axis=-1), (c ** 4).mean(axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.nan_to_num(np.where(sd > 0, m3 / sd ** 3, 0.0))
        kurt = np.clip(np.nan_to_num(np.where(sd > 0, m4 / sd ** 4 - 3, 0.0)), 0, None)
    if null is not None and n > 2:
        gt = tilted_skewness(d, null)
        g = np.clip(np.where(np.isnan(gt), g, gt), -(n - 2) / np.sqrt(n - 1), (n - 2) / np.sqrt(n - 1))
    df = np.maximum(2 / (2 / max(n - 1, 1) + kurt / n), 1.0)
    return mean, sd / np.sqrt(n), g / (3 * np.sqrt(n)), g / (6 * np.sqrt(n)), df


def _g(w: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hall's monotone transform of W = (mean - mu)/SE: w + a w^2 + a^2 w^3 / 3 + b."""
    return w + a * w ** 2 + a ** 2 * w ** 3 / 3 + b


def _g_inv(t: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        w = (np.cbrt(3 * a * (t - b) + 1) - 1) / a
    return np.where(np.abs(a) > 1e-12, w, t - b)


def t_bounds(d: np.ndarray, alpha: float, null: float | None = None
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """mean, SE, and one-sided (1 - alpha) bounds of the skewness-corrected t (Hall 1992).

    The plain t bound's one-sided error is O(1/sqrt n) times the skewness of d, and paired
    differences of a damaged build are skewed (losses outnumber gains): at Delta = -tol with
    1,500 items it passed 6% instead of 5% (benchmarks/gate_oc.py). Hall's transform of the
    studentised mean removes that term and stays monotone, so bounds and p-values agree.
    null: the Delta whose tilted skewness is used (the gate's margin -tol; see _hall). The bounds
    then answer the test at that margin exactly (L > -tol iff p_pass < alpha); null=None uses the
    sample's own skewness (the rule before, kept for benchmarks/gate_t_accuracy.py's comparison).
    """
    return _t_bounds(_hall(d, null), alpha)


def _t_bounds(h: tuple[np.ndarray, ...], alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    mean, se, a, b, df = h
    q = sps.t.ppf(1 - alpha, df)
    return mean, se, mean - _g_inv(q, a, b) * se, mean - _g_inv(-q, a, b) * se


def _t_p(h: tuple[np.ndarray, ...], tol: float) -> tuple[np.ndarray, np.ndarray]:
    """(p_pass, p_fail) of the corrected t test at the margin -tol (h = _hall(d, -tol)); SE = 0 decides by the sign."""
    mean, se, a, b, df = h
    side = mean + tol
    with np.errstate(divide="ignore", invalid="ignore"):
        w = side / se
    w = np.where(se > 0, w, np.where(side > 0, np.inf, np.where(side < 0, -np.inf, 0.0)))
    w = np.nan_to_num(w, nan=0.0, posinf=np.inf, neginf=-np.inf)
    t = np.where(np.isfinite(w), _g(np.where(np.isfinite(w), w, 0.0), a, b), w)
    return sps.t.sf(t, df), sps.t.cdf(t, df)


def paired_bounds(d: np.ndarray, tol: float, alpha: float = ALPHA, bounded: bool = False,
                  skew_at_margin: bool = True, scale: float = 1.0,
                  always_exact: bool = False) -> Bounds:
    """Bounds and p-values for delta = E[d] against the margin -tol (see the module docstring).

    bounded: d_i lies in [-1, 1] (both sides' per-item values in [0, 1]).
    scale: bounded d_i lie in [-scale, scale] (a capped distance); always_exact: the exact bound decides for every
    sample, not only when few items changed (a capped heavy-tailed distance, whose t bound PASSed 0.08-0.11 at
    excess = tol with 24 items: docs/gate.md); the gate's capped distances share its PASS side with a t bound that
    prices in an unseen tail (qverify.gate.unseen_tail.capped_bounds, which rule.measure calls).
    skew_at_margin=False: Hall's correction with the sample's own skewness (the rule before; benchmarks only).
    The skewness is tilted to the margin only for bounded metrics: their d_i take a few lattice values (j/K),
    all of which a sample shows, so a distribution on the sample's points can stand for the null. A distance
    (KL) is continuous and heavy-tailed; its sample lacks the far tail the tilt would need, and tilted it
    PASSed 0.054 at the margin against 0.0515 with its own skewness (benchmarks/gate_t_accuracy.py).
    """
    d = np.asarray(d, float)
    n = d.shape[-1]
    h = _hall(d, -tol if skew_at_margin and bounded else None)
    mean, se, lo, hi = _t_bounds(h, alpha)
    p_pass, p_fail = _t_p(h, tol)
    exact = np.zeros(mean.shape, bool)
    if bounded:
        exact = small_regime(d) | always_exact
        if exact.any():
            elo, ehi, epp, epf = bounds_and_p(d[exact] / scale, tol / scale, alpha)
            elo, ehi = elo * scale, ehi * scale
            lo, hi, p_pass, p_fail = (np.array(x, float, copy=True) for x in (lo, hi, p_pass, p_fail))
            lo[exact], hi[exact], p_pass[exact], p_fail[exact] = elo, ehi, epp, epf
    return Bounds(mean, se, lo, hi, p_pass, p_fail, exact, n, h[4])


def share_bounds(d: np.ndarray, tol: float, alpha: float = ALPHA) -> Bounds:
    """Exact one-sided bounds for a share of items, d_i = -1 where item i is hit (oriented: higher is better), else 0:
    Clopper-Pearson on the count k of n, and the binomial p-values at the margin (the share = tol), so that
    L > -tol iff p_pass < alpha. For kld/broken (prompts broken outright): a rare event whose count is near 0, where
    no normal approximation holds and the betting bound is a little wider than Clopper-Pearson (0 of n bounds the
    share at 1 - alpha^(1/n), about ln(1/alpha) / n)."""
    d = np.asarray(d, float)
    n = d.shape[-1]
    k = (d < 0).sum(axis=-1)
    hi_share = np.where(k >= n, 1.0, sps.beta.ppf(1 - alpha, k + 1, np.maximum(n - k, 1)))
    lo_share = np.where(k <= 0, 0.0, sps.beta.ppf(alpha, np.maximum(k, 1), n - k + 1))
    share = k / max(n, 1)
    se = np.sqrt(share * (1 - share) / max(n, 1))
    return Bounds(-share, se, -hi_share, -lo_share, sps.binom.cdf(k, n, tol), sps.binom.sf(k - 1, n, tol),
                  np.ones(np.shape(k), bool), n)
