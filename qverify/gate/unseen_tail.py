"""A PASS bound for a capped distance on a sample that shows no tail: the t bound with the tail it missed priced in.

kld/kld bounds the per-pair KL capped at `cap`, d_i in [-cap, cap] (oriented: higher is better). The exact betting
bound holds its level for every law, and pays for it on every sample: near the margin on light-tailed KL it PASSed
0.45 where the t bound PASSed 0.92 (150 items, excess 0.8 tol; issue 35.5). The t bound cannot simply replace it: when
a few of the candidate's items sit at the cap and the rest are light and tight, a sample that misses them looks like
a light build just inside the margin, and the t bound PASSed 0.10-0.34 at the margin (benchmarks/kld_hybrid.py).

Here the missed tail is priced in. Let p be the share of items below -TAIL cap (the tail) and mu_L the mean of the rest:
E d >= (1 - p) mu_L - p cap, the tail at its worst (-cap). A sample of n items shows no tail item with probability
(1 - p)^n, so for the law with share p the light items' t bound may be taken at level alpha / (1 - p)^n:

    L = min over p in [0, p_max) of  (1 - p) L_t(alpha / (1 - p)^n) - p cap,     (1 - p_max)^n = alpha

(a law with p >= p_max shows no tail item in n with probability <= alpha: nothing to bound). Under any law with
E d <= -tol and tail share p, P(L > -tol) <= (1 - p)^n * alpha / (1 - p)^n = alpha, up to the t bound's own
approximation on the items above -TAIL cap, a bounded variable. A sample with an item below -TAIL cap gets no bound
from here (L = -cap). The min is taken on a grid of p (GRID points), the bound and the p-value on the same points, so
L > -tol iff p_pass < alpha.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from qverify.gate import betting
from qverify.gate.bounds import Bounds, _hall, _t_bounds, _t_p, paired_bounds

TAIL = 0.75  # an item below -TAIL * cap is a tail item (7.5x kld/kld's tolerance, 5x the real build's largest item
# KL); an unseen one is priced in at any height, so TAIL only says which seen items leave the decision to betting:
# 0.5 cost light-tailed samples power (0.58 against 0.72 at 0.8 tol, the "light" model of benchmarks/kld_hybrid.py,
# 2,000 trials) and kept no law of its models further below the level
GRID = 256  # shares p on [0, p_max): a law whose p falls between two points is held by the next one up, at a level
# at most ((1 - p) / (1 - p'))^n <= (1/alpha)^(1/GRID) times alpha, 1.012 alpha here


def _shares(n: int, alpha: float) -> np.ndarray:
    return np.linspace(0.0, 1.0 - alpha ** (1.0 / n), GRID, endpoint=False)


def lower_and_p(d: np.ndarray, tol: float, alpha: float, cap: float) -> tuple[np.ndarray, np.ndarray]:
    """(L, p_pass) of E d at the margin -tol, d of shape (..., n) in [-cap, cap]; -cap and 1 where a tail item shows."""
    d = np.asarray(d, float)
    n = d.shape[-1]
    h = _hall(d)  # the sample's own skewness, as for every distance (bounds.paired_bounds)
    lo, p_pass = np.full(d.shape[:-1], np.inf), np.zeros(d.shape[:-1])
    for p in _shares(n, alpha):
        miss = (1 - p) ** n  # P(no tail item in n) for a law with tail share p
        lo = np.minimum(lo, (1 - p) * _t_bounds(h, alpha / miss)[2] - p * cap)
        p_pass = np.maximum(p_pass, miss * _t_p(h, (tol - p * cap) / (1 - p))[0])
    seen = (d < -TAIL * cap).any(axis=-1)
    return np.where(seen, -cap, lo), np.where(seen, 1.0, np.minimum(p_pass, 1.0))


BET_SHARE = 0.2  # of alpha, to the exact betting bound; the rest to the unseen-tail t bound (Bonferroni)


def capped_pass(d: np.ndarray, tol: float, alpha: float, cap: float, bet_share: float = BET_SHARE
                ) -> tuple[np.ndarray, np.ndarray]:
    """kld/kld's PASS side, (L, p_pass): PASS when the exact betting bound passes at alpha * bet_share or this
    module's bound at alpha * (1 - bet_share), so P(PASS | E d <= -tol) <= alpha (Bonferroni). The betting share
    keeps PASS within reach of a build that shows a tail (heavy-tailed KL, most of whose samples of 150 show one)."""
    d = np.asarray(d, float)
    a_bet, a_t = alpha * bet_share, alpha * (1 - bet_share)
    b_lo = betting.lower_bound(d / cap, a_bet) * cap
    b_p = betting.p_value(d / cap, -tol / cap, a_bet)
    t_lo, t_p = lower_and_p(d, tol, a_t, cap)
    return np.maximum(b_lo, t_lo), np.minimum(1.0, np.minimum(b_p / bet_share, t_p / (1 - bet_share)))


def capped_bounds(d: np.ndarray, tol: float, alpha: float, cap: float) -> Bounds:
    """The bounds of a capped distance (rule.measure, always_exact): FAIL from the exact betting bound at alpha
    (bounds.paired_bounds), PASS from capped_pass."""
    b = paired_bounds(d, tol, alpha, bounded=True, scale=cap, always_exact=True)
    lo, p_pass = capped_pass(d, tol, alpha, cap)
    return replace(b, lower=lo, p_pass=p_pass)
