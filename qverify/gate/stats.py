"""The gate's statistics: pure functions over per-item replicate matrices, no I/O.

A metric's data is two matrices, baseline B (n items x Kb replicates) and candidate C
(n x Kc), paired by row (item); NaN marks a missing value (an infrastructure error, or a
key the scorer did not emit for that response). Following Miller 2024 ("Adding Error
Bars to Evals"): differences are paired by item, standard errors are clustered by item,
and with K replicates per item Var(mean) = (Var(x) + E[sigma^2]/K) / n.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

POWER = 0.8
_CHUNK = 4_000_000  # bootstrap values held in memory at once


def item_means(x: np.ndarray) -> np.ndarray:
    """Per-item mean over the replicates that have a value (NaN for an item with none)."""
    cnt = (~np.isnan(x)).sum(axis=1)
    tot = np.where(np.isnan(x), 0.0, x).sum(axis=1)
    return np.divide(tot, cnt, out=np.full(len(x), np.nan), where=cnt > 0)


def replicate_means(x: np.ndarray) -> list[float]:
    """The suite mean of each replicate (a column), over the items it has."""
    return [float(np.nanmean(col)) for col in x.T if not np.isnan(col).all()]


def harmonic_count(x: np.ndarray) -> float:
    """Harmonic mean of the replicates per item: the K in Var(item mean) = s^2/K, averaged right."""
    cnt = (~np.isnan(x)).sum(axis=1)
    cnt = cnt[cnt > 0]
    return float(len(cnt) / np.sum(1.0 / cnt)) if len(cnt) else 0.0


def paired_rows(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Rows (items) with at least one value on both sides: the items that can be paired."""
    return (~np.isnan(b)).any(axis=1) & (~np.isnan(c)).any(axis=1)


# --------------------------------------------------------------------------- noise model


@dataclass(frozen=True)
class Noise:
    """Run-to-run noise of the baseline, estimated from its replicates."""

    n_items: int
    replicates: float  # mean replicates per item
    within_var: float  # E_i[ Var_k x_ik ]: the within-item variance (NaN with < 2 replicates)
    var_run_pooled: float  # within_var / n: variance of one replicate's suite mean, if items are independent
    var_run_direct: float | None  # variance of the replicate means themselves (Kb >= 2)
    var_run: float  # the one the band uses
    df: float  # degrees of freedom of var_run
    source: str  # "pooled" | "direct (run-level noise)" | "none"
    deterministic: bool  # every item identical across replicates

    def as_dict(self) -> dict[str, float | str | bool | None]:
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in self.__dict__.items()}


def noise_model(b: np.ndarray, check_run_level: bool = True) -> Noise:
    """Variance of the suite mean across replicates, from the within-item variance (many df).

    The direct variance of the Kb replicate means has only Kb-1 df, so it is used only
    when an F-test says it is larger than the pooled estimate (noise shared by all items
    of a run, e.g. a different kernel choice per server start).
    """
    n = len(b)
    cnt = (~np.isnan(b)).sum(axis=1)
    multi = cnt >= 2
    reps = float(cnt.mean()) if n else 0.0
    if n == 0 or not multi.any():
        return Noise(n, reps, math.nan, math.nan, None, math.nan, 0.0, "none", False)
    within = float(np.nanvar(b[multi], axis=1, ddof=1).mean())
    df = float((cnt[multi] - 1).sum())
    pooled = within / n
    means = replicate_means(b)
    direct = float(np.var(means, ddof=1)) if len(means) >= 2 else None
    deterministic = within == 0.0 and (direct is None or direct < 1e-18)
    var, source = pooled, "pooled"
    run_level = check_run_level and direct is not None and len(means) >= 3 and pooled > 0
    if run_level and direct / pooled > sps.f.ppf(0.99, len(means) - 1, df):
        var, source, df = direct, "direct (run-level noise)", float(len(means) - 1)
    return Noise(n, reps, within, pooled, direct, var, df, source, deterministic)


def noise_band(noise: Noise, kb: float, kc: float, alpha: float, m: int = 1) -> float:
    """Half-width of the prediction interval for a re-run of the baseline with kc replicates.

    Var(rerun mean - baseline mean) = var_run * (1/kc + 1/kb). The level is 1 - alpha/m:
    simultaneous over the m gated metrics (Bonferroni), so that a harmless build stays inside
    every band with probability >= 1 - alpha.
    """
    if noise.deterministic:
        return 0.0
    if noise.df <= 0 or math.isnan(noise.var_run) or kb <= 0 or kc <= 0:
        return math.nan
    q = sps.t.ppf(1 - alpha / (2 * max(m, 1)), noise.df)
    return float(q * math.sqrt(noise.var_run * (1 / kc + 1 / kb)))


# --------------------------------------------------------------------------- effect


@dataclass(frozen=True)
class Boot:
    delta: float
    ci_low: float
    ci_high: float
    se: float
    draws: np.ndarray  # bootstrap replicates of delta


def _compact(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values moved left in each row (NaN last), and the count per row."""
    order = np.argsort(np.isnan(x), axis=1, kind="stable")
    return np.take_along_axis(x, order, axis=1), (~np.isnan(x)).sum(axis=1)


def _residuals(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Within-item residuals inflated by sqrt(k/(k-1)) (so a resampled mean has variance s_i^2/k),
    compacted; the count per row; and s_i^2/k per row (0 for rows with < 2 values)."""
    xc, cnt = _compact(x)
    k = cnt.astype(float)
    m = item_means(x)
    infl = np.sqrt(np.divide(k, k - 1, out=np.zeros_like(k), where=k > 1))
    r = np.nan_to_num((xc - m[:, None]) * infl[:, None])
    var_mean = np.divide((r ** 2).sum(axis=1) / np.maximum(k, 1), k, out=np.zeros_like(k), where=k > 1)
    return r, cnt, var_mean


def _resampled_mean(r: np.ndarray, cnt: np.ndarray, idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Mean of each drawn item's residuals after resampling them with replacement."""
    k = r.shape[1]
    c = np.maximum(cnt[idx], 1)  # (B, n)
    col = (rng.random((*idx.shape, k)) * c[..., None]).astype(np.int64)
    vals = r[idx[..., None], col]
    mask = np.arange(k) < c[..., None]
    return np.where(mask, vals, 0.0).sum(axis=-1) / c


def paired_bootstrap(b: np.ndarray, c: np.ndarray, n_boot: int = 2000, seed: int = 0, alpha: float = 0.05,
                     within: bool = True) -> Boot:
    """Item-clustered paired bootstrap of delta = mean_i(c_i - b_i), c_i/b_i = per-item replicate means.

    Resample items with replacement (the same items on both sides: paired), then, with
    `within`, each drawn item's replicates with replacement on each side. Done naively the
    second stage counts the within-item noise twice (the item means already carry it): in
    an A/A comparison, where it is all the noise there is, the SE comes out ~1.4x too wide.
    So the first stage resamples item differences shrunk towards their mean by
    sqrt(1 - W/S^2) (S^2 = Var_i(d_i), W = E_i[s2_b/Kb + s2_c/Kc]) and the second stage adds
    the within-item residuals back: the two stages together have the variance S^2/n of the
    clustered SE (Davison & Hinkley 1997, s3.8). Rows must be paired (see `paired_rows`).
    """
    n = len(b)
    if n == 0:
        return Boot(math.nan, math.nan, math.nan, math.nan, np.array([]))
    rng = np.random.default_rng(seed)
    d = item_means(c) - item_means(b)
    delta = float(d.mean())
    rb, kb, wb = _residuals(b)
    rc, kc, wc = _residuals(c)
    s2 = float(d.var(ddof=1)) if n > 1 else 0.0
    within = within and float((wb + wc).mean()) > 0
    if within:
        shrink = math.sqrt(max(0.0, 1.0 - float((wb + wc).mean()) / s2)) if s2 > 0 else 0.0
        d = delta + shrink * (d - delta)
    per = max(1, _CHUNK // max(1, n * max(b.shape[1], c.shape[1])))
    draws = np.empty(n_boot)
    for s in range(0, n_boot, per):
        idx = rng.integers(0, n, size=(min(per, n_boot - s), n))
        dd = d[idx]
        if within:
            dd = dd + _resampled_mean(rc, kc, idx, rng) - _resampled_mean(rb, kb, idx, rng)
        draws[s:s + len(idx)] = dd.mean(axis=1)
    lo, hi = np.quantile(draws, [alpha / 2, 1 - alpha / 2])
    se = float(draws.std(ddof=1)) if n_boot > 1 else math.nan
    return Boot(delta, float(lo), float(hi), se, draws)


def p_not_below(draws: np.ndarray, threshold: float) -> float:
    """One-sided bootstrap p-value for H0 'delta >= threshold' (small p: delta is below it).

    The percentile p-value (1 + #{draws >= threshold}) / (B + 1) cannot go below 1/(B+1),
    which Holm over many metrics can need; when fewer than 10 draws reach the threshold the
    tail comes from the normal approximation with the bootstrap's mean and SE instead.
    """
    hits = int(np.sum(draws >= threshold))
    p = (1 + hits) / (len(draws) + 1)
    if hits < 10:
        sd = float(draws.std(ddof=1)) if len(draws) > 1 else 0.0
        mu = float(draws.mean())
        tail = float(sps.norm.sf((threshold - mu) / sd)) if sd > 0 else float(mu >= threshold)
        p = min(p, tail)
    return float(p)


def p_two_sided_zero(draws: np.ndarray) -> float:
    """Bootstrap p-value for delta = 0 (percentile inversion)."""
    lo = (1 + np.sum(draws <= 0)) / (len(draws) + 1)
    hi = (1 + np.sum(draws >= 0)) / (len(draws) + 1)
    return float(min(1.0, 2 * min(lo, hi)))


# --------------------------------------------------------------------------- power


def z_mde(alpha: float, power: float = POWER) -> float:
    """MDE multiplier: z_{1-alpha/2} + z_power = 2.80 at alpha 0.05, power 0.8 (Miller 2024)."""
    return float(sps.norm.ppf(1 - alpha / 2) + sps.norm.ppf(power))


def mde(se: float, alpha: float = 0.05, power: float = POWER) -> float:
    return z_mde(alpha, power) * se


@dataclass(frozen=True)
class Needed:
    items: int | None  # items (at the current replicate counts) for MDE <= tolerance
    replicates: int | None  # replicates per build (at the current items); None: replicates alone cannot do it


def needed_for(b: np.ndarray, c: np.ndarray, se: float, tolerance: float, alpha: float = 0.05,
               power: float = POWER) -> Needed:
    """How many items or replicates would bring the MDE down to the tolerance.

    Variance components from the data: SE^2 ~ r * (V_item + s2_b/Kb + s2_c/Kc) / n, where
    V_item is the spread of the true per-item effect and r the bootstrap's inflation over
    the analytic SE (its second stage). More items shrink all of it, more replicates only
    the within-item part.
    """
    n = len(b)
    target = tolerance / z_mde(alpha, power)
    if n < 2 or target <= 0 or not np.isfinite(se):
        return Needed(None, None)
    items = max(n, math.ceil(n * se ** 2 / target ** 2))
    kb, kc = (~np.isnan(b)).sum(1).mean(), (~np.isnan(c)).sum(1).mean()
    s2b = _within(b)
    s2c = _within(c)
    var_d = float(np.var(item_means(c) - item_means(b), ddof=1))
    se_an2 = var_d / n
    r = se ** 2 / se_an2 if se_an2 > 0 else 1.0
    # V_item counts only beyond twice its own sampling error: with ~100 items a zero spread of
    # per-item effects often estimates positive, which would wrongly say replicates cannot help
    v_item = max(var_d - s2b / kb - s2c / kc - 2 * var_d * math.sqrt(2 / (n - 1)), 0.0)
    room = n * target ** 2 / r - v_item
    reps = None
    if s2b + s2c > 0 and room > 0:
        reps = max(2, math.ceil((s2b + s2c) / room))
    return Needed(items, reps)


def _within(x: np.ndarray) -> float:
    multi = (~np.isnan(x)).sum(axis=1) >= 2
    return float(np.nanvar(x[multi], axis=1, ddof=1).mean()) if multi.any() else 0.0


# --------------------------------------------------------------------------- multiplicity


def holm(pvalues: list[float | None]) -> list[float | None]:
    """Holm step-down adjusted p-values (None stays None): adj_(j) = max_{i<=j} min(1, (m-i) p_(i))."""
    idx = [i for i, p in enumerate(pvalues) if p is not None and not math.isnan(p)]
    m = len(idx)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(sorted(idx, key=lambda i: pvalues[i])):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out
