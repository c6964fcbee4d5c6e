"""The item models and simulation primitives every gate OC benchmark shares (gate_oc.py, gate_oc_rows.py,
gate_oc_sequence.py, gate_oc_v4.py, main_job_oc.py, gate_t_accuracy.py, calib_table.py): one module below them,
so that none imports another's script (they imported each other in a circle, issue 38).

A trial draws a suite of n items from a population (each item's success probability p_i: always right, always
wrong, or unstable with p ~ U(0.15, 0.85)), a candidate whose true population Delta is the operating point, and K
replicates per build where replicate k of an item shares its seed on both builds: with probability `coupling` the
candidate's draw reuses the baseline's uniform (common random numbers), else it is fresh. Damage is diffuse (every
item's p scaled down) or concentrated (a random share of items always wrong).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from qverify.gate.boundaries import SPEND_GAMMA, nominal_levels
from qverify.gate.bounds import paired_bounds

TOL, ALPHA = 0.03, 0.05
KLD_SELF = 0.2  # the baseline's own run-to-run KL, in tolerances (model "kld")
SKEW_AT_MARGIN = True  # False: the t bound's skewness from the sample itself, the rule before (gate_t_accuracy.py)
MODELS = {  # (always right, always wrong); the rest unstable
    "noisy": (0.60, 0.15),  # a T=0.6 suite (toolcall-like): 25% of items flip run to run
    "stable": (0.80, 0.15),  # a T=0 suite on a nondeterministic stack: 5% flip
    "ceiling": (1.00, 0.00),  # every item always right
    "ushaped": (0.0, 0.0),  # heterogeneous: every item's p ~ Beta(0.3, 0.3), U-shaped (most near 0 or 1)
}
USHAPE = 0.3


def look_sizes(first: int, per_round: int, max_items: int) -> list[int]:
    """Items after each look: first, first + per_round, ... up to max_items (the last look is at max_items)."""
    out = list(range(first, max_items + 1, per_round)) if per_round > 0 else [first]
    if not out or out[-1] != max_items:
        out.append(max_items)
    return out


@dataclass(frozen=True)
class Point:
    delta: float
    n: int
    k: int = 3
    coupling: float = 0.5
    damage: str = "diffuse"  # or "concentrated", or "mixed" (half the loss each way)
    model: str = "noisy"
    rep_corr: float = 0.0  # with this probability an item's replicates share one draw (correlated replicates)


def population_mean(model: str) -> float:
    if model == "ushaped":
        return 0.5
    r, w = MODELS[model]
    return r + (1 - r - w) * 0.5


def draw(pt: Point, trials: int, rng: np.random.Generator, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) 0/1 outcomes, trials x n x K, bool."""
    n = n or pt.n
    r, w = MODELS[pt.model]
    u = rng.random((trials, n), dtype=np.float32)
    p = np.where(u < r, 1.0, np.where(u < r + w, 0.0, 0.15 + 0.7 * rng.random((trials, n), dtype=np.float32)))
    if pt.model == "ushaped":
        p = rng.beta(USHAPE, USHAPE, (trials, n)).astype(np.float32)
    share = -pt.delta / population_mean(pt.model)
    if pt.damage == "diffuse":
        q = p * (1 - share)
    elif pt.damage == "mixed":  # half the share of items lost outright, the rest scaled: (1 - a)(1 - b) = 1 - share
        a = share / 2
        q = np.where(rng.random((trials, n), dtype=np.float32) < a, 0.0, p * (1 - share) / (1 - a))
    else:
        q = np.where(rng.random((trials, n), dtype=np.float32) < share, 0.0, p)
    ub = rng.random((trials, n, pt.k), dtype=np.float32)
    fresh = rng.random((trials, n, pt.k), dtype=np.float32)
    if pt.rep_corr > 0:  # correlated replicates: some items draw once for all their replicates
        same = rng.random((trials, n, 1)) < pt.rep_corr
        ub, fresh = np.where(same, ub[..., :1], ub), np.where(same, fresh[..., :1], fresh)
    uc = np.where(rng.random((trials, n, pt.k), dtype=np.float32) < pt.coupling, ub, fresh)
    return ub < p[..., None], uc < q[..., None]


def f1(ref: np.ndarray, pred: np.ndarray) -> np.ndarray:
    tp = (ref & pred).sum(-1)
    den = 2 * tp + (~ref & pred).sum(-1) + (ref & ~pred).sum(-1)
    return np.where(den > 0, 2 * tp / np.maximum(den, 1), 1.0)


def anchors(b: np.ndarray, c: np.ndarray) -> dict[str, np.ndarray]:
    b0, c0 = b[..., 0].mean(-1), c[..., 0].mean(-1)
    out = {"recovery>=0.95": np.round(c0 / np.maximum(b0, 1e-9), 2) >= 0.95,
           "rtol 0.08": np.abs(c0 - b0) <= 0.08 * b0, "1 run, 1 point": c0 >= b0 - 0.01}
    if b.shape[-1] >= 2:
        k = b.shape[-1]
        floor = np.min([f1(b[..., i], b[..., j]) for i in range(k) for j in range(i + 1, k)], axis=0) - 0.03
        out["K2VV F1 floor"] = f1(b[..., 0], c[..., 1]) >= floor
    return out


def fixed(pt: Point, trials: int, rng: np.random.Generator, chunk: int = 1000, tol: float = TOL) -> dict[str, float]:
    """P(PASS), P(FAIL) of the fixed rule and P(pass) of each anchor, over `trials` trials (margin tol)."""
    acc: dict[str, float] = {}
    for s in range(0, trials, chunk):
        m = min(chunk, trials - s)
        b, c = draw(pt, m, rng)
        d = c.mean(-1, dtype=np.float64) - b.mean(-1, dtype=np.float64)
        bd = paired_bounds(d, tol, ALPHA, bounded=True, skew_at_margin=SKEW_AT_MARGIN)
        res = {"PASS": bd.lower > -tol, "FAIL": bd.upper < -tol, **anchors(b, c)}
        for key, v in res.items():
            acc[key] = acc.get(key, 0.0) + float(np.sum(v))
    return {k: v / trials for k, v in acc.items()}


def paired_d(pt: Point, trials: int, rng: np.random.Generator, n: int) -> tuple[np.ndarray, bool]:
    """Per-item paired differences oriented higher-is-better, trials x n, and whether they are bounded.

    model "kld": a distance (lower is better) whose d_i = KL_i(baseline || candidate) - the baseline's own
    run-to-run KL_i, both Gamma(0.5)-distributed per item (heavy-tailed, CV 1.4), the own KL of mean
    KLD_SELF * tol; the candidate's excess mean KL is -delta (delta 0: as close as the baseline to itself).
    Distances are in units of the suite's tolerance, so TOL serves every model."""
    if pt.model == "kld":
        own = rng.gamma(0.5, KLD_SELF * TOL / 0.5, (trials, n))
        cand = rng.gamma(0.5, (KLD_SELF * TOL - pt.delta) / 0.5, (trials, n))
        return -(cand - own), False
    b, c = draw(pt, trials, rng, n=n)
    return c.mean(-1, dtype=np.float64) - b.mean(-1, dtype=np.float64), True


def look_decisions(pt: Point, trials: int, rng: np.random.Generator, looks: list[int], pass_levels, fail_levels,
                   chunk: int = 500) -> tuple[np.ndarray, np.ndarray]:
    """Per trial, the first look (index) at which the PASS bound (at pass_levels[j]) clears -tol, and the first
    at which the FAIL bound (fail_levels[j]) does before any PASS; len(looks) where none does."""
    big = len(looks)
    pass_at, fail_at = [], []
    for s in range(0, trials, chunk):
        m = min(chunk, trials - s)
        d, bounded = paired_d(pt, m, rng, looks[-1])
        pa, fa = np.full(m, big), np.full(m, big)
        for j, (n, lp, lf) in enumerate(zip(looks, pass_levels, fail_levels)):
            open_ = (pa == big) & (fa == big)
            if not open_.any():
                break
            bd = paired_bounds(d[open_, :n], TOL, lp, bounded=bounded, skew_at_margin=SKEW_AT_MARGIN)
            lo, hi = bd.lower, (bd if lf == lp else paired_bounds(d[open_, :n], TOL, lf, bounded=bounded,
                                                                 skew_at_margin=SKEW_AT_MARGIN)).upper
            idx = np.flatnonzero(open_)
            fa[idx[hi < -TOL]] = j
            pa[idx[(lo > -TOL) & ~(hi < -TOL)]] = j
        pass_at.append(pa)
        fail_at.append(fa)
    return np.concatenate(pass_at), np.concatenate(fail_at)


def sequential(pt: Point, trials: int, rng: np.random.Generator, first: int, per_round: int, max_items: int,
               alpha: float = ALPHA, gamma: float = SPEND_GAMMA, fail_family: int = 1) -> dict[str, float]:
    """One metric under the budgeted sequential rule: a look after each round at the group-sequential nominal
    levels (PASS at alpha, FAIL at alpha / fail_family), stop when decided."""
    looks = look_sizes(first, per_round, max_items)
    lp, lf = design_levels(looks, alpha, gamma, fail_family)
    pa, fa = look_decisions(pt, trials, rng, looks, lp, lf)
    stop = np.minimum(np.minimum(pa, fa), len(looks) - 1)
    req = 2 * pt.k * np.asarray(looks)[stop]  # both builds, K replicates per item
    return {"PASS": float(np.mean(pa < len(looks))), "FAIL": float(np.mean(fa < len(looks))),
            "median_requests": float(np.median(req)), "mean_requests": float(np.mean(req))}


def design_levels(looks: list[int], alpha: float, gamma: float, fail_family: int) -> tuple[list[float], list[float]]:
    """Nominal per-look levels of the PASS test (alpha) and of one metric's FAIL test in a family of fail_family
    (Bonferroni: the first step of Holm, all the build's FAIL verdict needs)."""
    fr = tuple(float(n) for n in looks)
    return list(nominal_levels(fr, alpha, gamma)), list(nominal_levels(fr, alpha / fail_family, gamma))


# A main job's gate: one gated metric per suite, each with its own noise model (coupling, damage)
GATE_SUITES = {"toolcall": Point(0.0, 0, 3, 0.5, "diffuse", "noisy"),  # T=0.6: 25% of items flip
               "stable": Point(0.0, 0, 3, 0.5, "diffuse", "stable"),  # T=0 on a nondeterministic stack: 5% flip
               "coding": Point(0.0, 0, 3, 0.9, "concentrated", "ceiling"),  # every item always right
               "kld": Point(0.0, 0, 3, 0.0, "diffuse", "kld")}  # a distance to the baseline
GATE_STATES = [("all Δ=0", {}), ("toolcall -2 tol", {"toolcall": -2.0}), ("toolcall -tol", {"toolcall": -1.0}),
               ("toolcall -tol/2", {"toolcall": -0.5}), ("stable -2 tol", {"stable": -2.0}),
               ("coding loses 5% of items", {"coding": -0.05 / TOL}), ("kld +2 tol", {"kld": -2.0}),
               ("all -2 tol", {s: -2.0 for s in GATE_SUITES})]


def whole_gate(state: dict[str, float], trials: int, rng: np.random.Generator, looks: list[int], levels
               ) -> dict[str, float]:
    """Whole gates at one true state: P(PASS), P(FAIL), requests per gate (all suites, both builds).

    levels = (PASS levels, FAIL levels) per look, FAIL levels for one metric in the family of len(GATE_SUITES).
    A suite stops once its metric is decided, every suite once the build has FAILed (one FAIL decides it);
    with one look this is the fixed design (every suite at the same n, as `qverify gate --limit n`)."""
    big, stops, fails, passes = len(looks), [], [], []
    for name, pt in GATE_SUITES.items():
        pt = Point(state.get(name, 0.0) * TOL, 0, pt.k, pt.coupling, pt.damage, pt.model)
        pa, fa = look_decisions(pt, trials, rng, looks, *levels)
        passes.append(pa < big)
        fails.append(fa)
        stops.append(np.minimum(pa, fa))
    gate_fail = np.min(fails, axis=0)
    at = np.asarray(looks)[np.minimum(np.minimum(np.asarray(stops), gate_fail), big - 1)]
    req = 2 * 3 * at.sum(axis=0)
    return {"PASS": float(np.mean(np.all(passes, axis=0) & (gate_fail == big))), "FAIL": float(np.mean(gate_fail < big)),
            "median_requests": float(np.median(req)), "mean_requests": float(np.mean(req))}
