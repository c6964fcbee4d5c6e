"""Errored requests in the bounds: counted at their worst for PASS and at their best for FAIL.

A request that errored (timeout, 5xx, no answer) has no score, and dropping it assumes it would have scored like the
rest. A broken build's errors fall where it is broken (a model that loops until the timeout, a server that 500s on
a malformed tool call), so dropping them hides exactly the damage the gate is for: at toolcall Δ = −tol, 300 items
x 3, 1.9% of the candidate's requests erroring on the items it loses, the gate PASSed 0.171 (issue 35). So each
bound holds whatever the errored requests would have scored (a worst-case bound, Manski 1989):

* PASS (the lower bound L): an errored candidate request counts as the metric's worst value, an errored baseline
  request as its best;
* FAIL (the upper bound U): the reverse, so errors never make a FAIL either.

With no errors both are the plain bounds; each errored request widens them by at most (range / n K). The report
keeps Δ on the answered requests and says what the errors cost each bound (Bounds.error_cost). A cell is filled
only where the item belongs to the metric (some answered request of the item, on either side, has the score):
a metric scored on some items only (a per-kind family) gains no items of another kind. The error budget
(qverify.config.ERROR_BUDGET) stays the guard against infrastructure trouble; this is the guard against errors that
are the build's own.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qverify.gate.design import item_means


@dataclass(frozen=True)
class Filled:
    for_pass: tuple[np.ndarray, np.ndarray]  # (b, c): errored baseline cells at the best, candidate's at the worst
    for_fail: tuple[np.ndarray, np.ndarray]  # the reverse
    baseline: int  # errored cells filled on each side
    candidate: int


def fill(b: np.ndarray, c: np.ndarray, eb: np.ndarray, ec: np.ndarray, worst: float, best: float) -> Filled | None:
    """b, c with errored cells filled for PASS and for FAIL, or None when no scored item has an error.

    b, c: items x replicates scores (NaN: no score); eb, ec: the same shapes, True where the request errored;
    worst / best: the metric's worst and best per-request values (0 and 1 for a higher-is-better rate)."""
    belongs = (~np.isnan(b)).any(axis=1) | (~np.isnan(c)).any(axis=1)
    eb, ec = eb & belongs[:, None], ec & belongs[:, None]
    if not (eb.any() or ec.any()):
        return None
    return Filled((np.where(eb, best, b), np.where(ec, worst, c)), (np.where(eb, worst, b), np.where(ec, best, c)),
                  int(eb.sum()), int(ec.sum()))


def pair_errors(ek: np.ndarray, el: np.ndarray, pairs: list[tuple[int, int]]) -> np.ndarray:
    """items x pairs: True where either run of the pair (k from ek's runs, l from el's) errored."""
    if not pairs:
        return np.zeros((len(ek), 0), bool)
    return np.stack([ek[:, k] | el[:, l] for k, l in pairs], axis=1)


def fill_pairs(b: np.ndarray, c: np.ndarray, eb: np.ndarray, ec: np.ndarray, worst: float, best: float
               ) -> Filled | None:
    """fill() for pairwise distances: b holds the baseline's own pairs, c the (baseline, candidate) pairs, eb / ec
    which pairs involve an errored request. For PASS a candidate pair counts at its worst and a baseline pair at its
    best (far from the baseline, the baseline close to itself); for FAIL the reverse."""
    return fill(b, c, eb & np.isnan(b), ec & np.isnan(c), worst, best)


def fill_f1(b: np.ndarray, c: np.ndarray, eb: np.ndarray, ec: np.ndarray) -> Filled | None:
    """fill() for trigger-F1's 0/1 tool-call matrices (F1 against the baseline's runs). F1 is a ratio over items,
    not a mean of per-request values, so no one value is the worst for every pair of runs; this takes the
    natural one: for PASS an errored candidate request disagrees with the baseline's majority for the item and
    an errored baseline request agrees with it (the baseline reproduces itself); for FAIL the candidate's
    agrees with the baseline's majority and the baseline's takes the candidate's majority. Approximate, where
    fill() is exact."""
    def majority(x: np.ndarray) -> np.ndarray:
        m = item_means(x)
        return np.where(np.isnan(m), 0.0, np.round(m))[:, None]

    if not (eb.any() or ec.any()):
        return None
    mb, mc = majority(np.where(eb, np.nan, b)), majority(np.where(ec, np.nan, c))
    return Filled((np.where(eb, mb, b), np.where(ec, 1 - mb, c)), (np.where(eb, mc, b), np.where(ec, mb, c)),
                  int(eb.sum()), int(ec.sum()))
