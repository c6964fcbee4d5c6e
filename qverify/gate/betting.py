"""An exact one-sided bound on the mean of paired differences d_i in [-1, 1], by betting.

Source: Waudby-Smith & Ramdas (2023), "Estimating means of bounded random variables by betting"
(JRSS-B 86(1)), sections 3-4: to test H0: E[d] <= m, bet a share lam_i >= 0 of the capital on
d_i - m, lam_i chosen from the items before i only (predictable):

    K_t(m) = prod_{i <= t} (1 + lam_i (d_i - m)),   0 <= lam_i <= c / (1 + m),  c < 1,

a nonnegative supermartingale under H0 (E[1 + lam (d - m)] <= 1), so by Ville's inequality
P(max_t K_t(m) >= 1/alpha) <= alpha for every item law with mean <= m: no normal approximation,
no assumption on the shape of d. The cap keeps every factor > 0 (d >= -1). Bets use their
predictable plug-in (their eq. (26), fixed-n form): lam_i = sqrt(2 log(1/alpha) / (n s2_{i-1})),
s2 the running variance with a prior worth one item.

Unlike Clopper-Pearson on gains and losses separately (the rule before, issue 29), one bet on
d_i lets a gain on one item cancel a loss on another: noise that cancels is paid for once.

* p-value of H0 "E[d] <= m": min(1, 1 / max_t K_t(m)) (Ville), anytime-valid.
* lower bound: L = inf{m : max_t K_t(m) < 1/alpha}. K_t(m) is nonincreasing in m (each factor
  is: lam = min(a, c/(1+m)) falls as m rises, and lam (m - d) rises for d < m), so the rejected
  m form an interval [-1, L) and L is found by bisection; L > m0 iff p(m0) < alpha.
* the upper bound / H0 "E[d] >= m" are the same on -d.

The items are bet on in a fixed pseudo-random order (blocks of 20 shuffled by a seed of their own,
never by the data): Ville needs each item's mean given the items before it to be the population's, which a
suite's own order need not give (a generator may order items by length or difficulty), while
items placed in an order drawn independently of them are exchangeable. The bound stays a
function of the data alone (same items, same bound). CAP and the prior were chosen by the operating characteristic (benchmarks/gate_oc.py, 4,000
trials per point): at 40 items x 3 replicates, tol 0.10, the bets hit the cap, and c 0.9 -> 0.95 with
prior 1 -> 0.25 moved P(PASS | 0) on U-shaped items from 0.455 to 0.514; P(PASS | -tol) stayed <= 0.04.
"""

from __future__ import annotations

import math

import numpy as np

CAP = 0.95  # c: the largest share of capital one item may risk (any c < 1 keeps the level)
_PRIOR_VAR = 0.25  # s2's prior, worth one item (any predictable choice keeps the level)


BLOCK = 20


def order(n: int) -> np.ndarray:
    """The betting order of n items: each block of BLOCK items in the suite's order is shuffled by a permutation
    seeded by the block alone, so a look at more items keeps the earlier looks' order (the budgeted gate's looks
    then bet on one sequence; a permutation seeded by n reshuffled every look and let the ten looks of
    tests/gate/test_oc.py PASS 0.0625 at -tol)."""
    out = []
    for start in range(0, n, BLOCK):
        size = min(BLOCK, n - start)
        out.append(start + np.random.default_rng([start, size]).permutation(size))
    return np.concatenate(out) if out else np.arange(0)


def _log_capital(d: np.ndarray, m: np.ndarray, alpha: float | np.ndarray) -> np.ndarray:
    """max_t log K_t(m), d shape (..., n), m and alpha broadcastable to d.shape[:-1]."""
    n = d.shape[-1]
    d = d[..., order(n)]
    m = np.asarray(m, float)[..., None]
    csum = np.cumsum(d, axis=-1)
    i = np.arange(1, n + 1)
    mean = csum / i
    # s2 before item t+1: (prior + sum_{i<=t} (d_i - mean_t)^2) / (t + 1)
    ss = np.cumsum(d * d, axis=-1) - csum * mean
    s2 = np.concatenate([np.full(d.shape[:-1] + (1,), _PRIOR_VAR), (_PRIOR_VAR + ss[..., :-1]) / (i[:-1] + 1)], axis=-1)
    s2 = np.maximum(s2, 1e-4)
    a = np.sqrt(2 * np.log(1 / np.asarray(alpha, float))[..., None] / (n * s2))
    lam = np.minimum(a, CAP / (1 + m))
    with np.errstate(divide="ignore"):
        logk = np.cumsum(np.log1p(lam * (d - m)), axis=-1)
    return logk.max(axis=-1)


def p_value(d: np.ndarray, m: float, alpha: float | np.ndarray) -> np.ndarray:
    """p-value of H0: E[d] <= m (alpha only tunes the bets; the p-value is valid whatever it is)."""
    return np.minimum(1.0, np.exp(-_log_capital(np.asarray(d, float), np.full(np.shape(d)[:-1], m), alpha)))


def lower_bound(d: np.ndarray, alpha: float | np.ndarray, iters: int = 32) -> np.ndarray:
    """One-sided (1 - alpha) lower bound of E[d], d in [-1, 1], shape (..., n)."""
    d = np.asarray(d, float)
    lo, hi = np.full(d.shape[:-1], -1.0), np.full(d.shape[:-1], 1.0)
    target = math.log(1 / alpha) if np.ndim(alpha) == 0 else np.log(1 / np.asarray(alpha, float))
    for _ in range(iters):
        mid = (lo + hi) / 2
        rejected = _log_capital(d, mid, alpha) >= target
        lo, hi = np.where(rejected, mid, lo), np.where(rejected, hi, mid)
    return lo


def bounds_and_p(d: np.ndarray, tol: float, alpha: float | np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(lower, upper, p_pass, p_fail) at the margin -tol: p_pass tests E[d] <= -tol, p_fail E[d] >= -tol."""
    d = np.asarray(d, float)
    return (lower_bound(d, alpha), -lower_bound(-d, alpha),
            p_value(d, -tol, alpha), p_value(-d, tol, alpha))
