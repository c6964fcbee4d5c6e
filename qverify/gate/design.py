"""From the runner's design to per-item paired differences d_i (the input of qverify.gate.bounds).

The runner samples replicate k of item i with seed f(i, k) on every build, so column k of
the baseline and column k of the candidate share a seed (common random numbers); items are
independent draws from the suite. So:

* a mean metric's d_i = (candidate mean - baseline mean) over item i's replicates, and the
  item is the cluster: Var(mean d) = Var_i(d_i)/n already holds the shared-seed covariance;
* a distance (KL, greedy output identity) compares runs pairwise. The baseline's own
  distance uses pairs of its runs (k, l), k != l, which never share a seed; so the
  candidate's distance to the baseline uses only pairs (baseline k, candidate j) with
  j != k as well. Same-seed pairs would make the candidate look closer than a rerun of the
  baseline could be, a bias the baseline side cannot have.
* trigger-F1 is a ratio over all items. Its Delta (mean F1 over candidate-vs-baseline pairs
  minus mean F1 over baseline pairs, the same pair rule) is linearised with the item-level
  jackknife: pv_i = n Delta - (n-1) Delta_(-i), centred on Delta; their sd/sqrt(n) is the
  jackknife SE (the delta method's, asymptotically).
* the run-to-run noise report: the SD of one run's suite mean across reseeded reruns,
  sqrt(mean_i s_i^2 / n) from the within-item variance over the baseline's replicates
  (different seeds by construction).
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np

from qverify.gate.pairwise import f1_score, is_binary  # noqa: F401  (is_binary: qverify.gate.assemble reads it here)


def item_means(x: np.ndarray) -> np.ndarray:
    """Mean over each item's replicates (NaN: none); an all-NaN row is expected, not a warning."""
    if x.size == 0:
        return np.full(len(x), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(x, axis=1)


def mean_diffs(b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(d_i, rows kept): items with at least one value on each side."""
    db, dc = item_means(b), item_means(c)
    rows = ~np.isnan(db) & ~np.isnan(dc)
    return dc[rows] - db[rows], rows


def is_unit(*xs: np.ndarray) -> bool:
    return all(((x[~np.isnan(x)] >= 0) & (x[~np.isnan(x)] <= 1)).all() for x in xs)


def run_noise_sd(b: np.ndarray) -> float | None:
    """SD of one run's suite mean across reruns with fresh seeds (None: fewer than 2 replicates)."""
    cnt = (~np.isnan(b)).sum(axis=1)
    multi = cnt >= 2
    if not multi.any():
        return None
    within = float(np.nanvar(b[multi], axis=1, ddof=1).mean())
    return float(np.sqrt(within / multi.sum()))


def base_pairs(kb: int, ordered: bool) -> list[tuple[int, int]]:
    """Pairs of baseline runs (never the same seed): ordered for asymmetric distances (KL)."""
    return list(itertools.permutations(range(kb), 2) if ordered else itertools.combinations(range(kb), 2))


def cross_pairs(kb: int, kc: int) -> list[tuple[int, int]]:
    """(baseline run k, candidate run j) pairs that do not share a seed: j != k.

    With a single run on each side no such pair exists; the same-seed pair is then all
    there is and the caller says so (deterministic suites, e.g. greedy at T=0, are unaffected).
    """
    pairs = [(k, j) for k in range(kb) for j in range(kc) if j != k]
    return pairs or [(k, j) for k in range(kb) for j in range(kc)]


# --------------------------------------------------------------------------- trigger-F1


def _counts(ref: np.ndarray, pred: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    ok = ~np.isnan(ref) & ~np.isnan(pred)
    r, p = (ref == 1) & ok, (pred == 1) & ok
    return (r & p).astype(float), (~r & p & ok).astype(float), (r & ~p & ok).astype(float), ok


def f1_with_jackknife(ref: np.ndarray, pred: np.ndarray) -> tuple[float, np.ndarray]:
    """F1 of `pred` against `ref` (1 = tool call) on all items, and with each item left out.

    NaN where F1 is undefined (no tool call in either run: qverify.gate.pairwise.f1_score). Items missing on either side
    contribute nothing, so their leave-one-out value equals the full value.
    """
    tp, fp, fn, _ = _counts(ref, pred)
    full = float(f1_score(tp.sum(), fp.sum(), fn.sum()))
    loo = f1_score(tp.sum() - tp, fp.sum() - fp, fn.sum() - fn)
    return full, loo


def trigger_f1_diffs(b: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, float, float]:
    """Jackknife pseudo-values of Delta F1 per item (NaN array if F1 is undefined), baseline F1, candidate F1.

    Baseline F1: mean over pairs of its runs; candidate F1: mean over (baseline k, candidate
    j != k) pairs. Undefined (no tool call on either side of some pair) -> NaN.
    """
    n = len(b)
    bp = [f1_with_jackknife(b[:, k], b[:, l]) for k, l in base_pairs(b.shape[1], ordered=False)]
    cp = [f1_with_jackknife(b[:, k], c[:, j]) for k, j in cross_pairs(b.shape[1], c.shape[1])]
    if not bp or not cp:
        return np.full(n, np.nan), np.nan, np.nan
    fb = float(np.mean([f for f, _ in bp]))
    fc = float(np.mean([f for f, _ in cp]))
    loo = np.mean([x for _, x in cp], axis=0) - np.mean([x for _, x in bp], axis=0)
    delta = fc - fb
    pv = n * delta - (n - 1) * loo
    # centred on the plug-in Delta (their own mean is the bias-corrected one): the SE is the same
    return pv - pv.mean() + delta, fb, fc
