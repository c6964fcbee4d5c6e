"""How many fewer items can any sequential test need for ONE metric? Wald's SPRT against the fixed design and the
gate's group-sequential design, on normal per-item differences.

    OMP_NUM_THREADS=1 python benchmarks/gate_sequential_limit.py [--trials 20000]

One metric, margin -tol, alpha 0.05 per test, power 0.8: PASS (H0 Delta <= -tol) at Delta = 0, FAIL (H0 Delta >= -tol)
at Delta = -2 tol. Per-item differences d ~ N(Delta, sigma^2) (the CLT limit of every suite model; sigma known), in
units of the fixed design's n_f = ((z_0.95 + z_0.8) sigma / tol)^2 items.

* fixed: n_f items, one look (PASS when the lower bound clears -tol, FAIL when the upper bound is below it).
* SPRT (Wald 1947): two sequential probability ratio tests, PASS: Delta = -tol vs 0, FAIL: -tol vs -2 tol, each with
  boundaries log((1 - beta)/alpha) and log(beta/(1 - alpha)); the metric stops at a PASS or a FAIL, or when both have
  accepted their H0. Among all sequential tests with these error rates the SPRT has the smallest expected sample size
  at both of its hypotheses (Wald & Wolfowitz 1948), so its E[N] at Delta = 0 and -2 tol is the floor for any design.
  Wald's approximation at the design point: E[N] = 2 ((1-beta) log((1-beta)/alpha) + beta log(beta/(1-alpha))) /
  (z_0.95 + z_0.8)^2 n_f = 0.617 n_f (ignores the overshoot, negligible here: one item moves the log LR by ~0.12).
* group-sequential: the gate's design (qverify.gate.boundaries, HSD spending): J looks of n1 items up to R n_f items;
  the best other schedule of a search (J 16/32, R 1.1/1.25/1.5, HSD gamma 1-4, 8,000 sequences each, power >= 0.8 at
  both design points); and the gate's with a non-binding Wald futility stop (a metric stops INCONCLUSIVE once both
  log LRs are below log(beta_f/(1 - alpha)), beta_f 0.2: what the SPRT does and the gate does not).

Every rate and sample size is over `trials` simulated sequences (one item at a time), the same count per row.
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np
from scipy import stats as sps

from qverify.gate.boundaries import nominal_levels

ALPHA, BETA = 0.05, 0.2
N_F = 400  # items of the fixed design (the unit; any value gives the same ratios up to the one-item overshoot)
TOL = (sps.norm.ppf(1 - ALPHA) + sps.norm.ppf(1 - BETA)) / math.sqrt(N_F)  # sigma = 1
DELTAS = (0.0, -0.5, -1.0, -1.5, -2.0, 1.0, -4.0)  # in tolerances; design points 0 and -2


def wald_asn_design() -> float:
    """E[N]/n_f of the SPRT at its alternative (Wald's approximation, no overshoot)."""
    a, b = math.log((1 - BETA) / ALPHA), math.log(BETA / (1 - ALPHA))
    return 2 * ((1 - BETA) * a + BETA * b) / (sps.norm.ppf(1 - ALPHA) + sps.norm.ppf(1 - BETA)) ** 2


def sprt(delta: float, trials: int, rng: np.random.Generator, cap: int = 20 * N_F) -> dict[str, float]:
    """Two SPRTs on one stream of items; N = items when the metric stops (PASS, FAIL, or both accepted H0)."""
    up, lo = math.log((1 - BETA) / ALPHA), math.log(BETA / (1 - ALPHA))
    s = np.zeros(trials)  # running sum of (d + tol)
    p_open, f_open = np.ones(trials, bool), np.ones(trials, bool)
    passed, failed = np.zeros(trials, bool), np.zeros(trials, bool)
    n_stop = np.full(trials, cap)
    for n in range(1, cap + 1):
        live = (p_open | f_open) & ~passed & ~failed
        if not live.any():
            break
        s[live] += rng.standard_normal(live.sum()) + delta * TOL + TOL
        llr_p = TOL * s - n * TOL ** 2 / 2  # log LR of Delta = 0 vs -tol
        llr_f = -TOL * s - n * TOL ** 2 / 2  # of -2 tol vs -tol
        passed |= live & p_open & (llr_p >= up)
        failed |= live & f_open & (llr_f >= up)
        p_open &= ~(live & (llr_p <= lo))
        f_open &= ~(live & (llr_f <= lo))
        done = live & (passed | failed | (~p_open & ~f_open))
        n_stop[done] = n
    return {"PASS": passed.mean(), "FAIL": failed.mean(), "median": float(np.median(n_stop)), "mean": n_stop.mean()}


def group_sequential(delta: float, trials: int, rng: np.random.Generator, looks: list[int], gamma: float,
                     futility: float | None = None) -> dict[str, float]:
    """The gate's rule on the same model: at look j, PASS when (mean + tol) sqrt(n) >= c_j, FAIL when
    -(mean + tol) sqrt(n) >= c_j (c_j from the HSD(gamma) spending; sigma known), stop when decided; with
    `futility` (beta_f), also once both SPRT log LRs have been below log(beta_f / (1 - alpha)) (non-binding: the
    error rates can only fall)."""
    c = sps.norm.isf(np.asarray(nominal_levels(tuple(float(n) for n in looks), ALPHA, gamma)))
    low = math.log(futility / (1 - ALPHA)) if futility else -math.inf
    futile_p, futile_f = np.zeros(trials, bool), np.zeros(trials, bool)
    inc = np.diff(np.concatenate([[0], looks]))
    s = np.zeros(trials)
    decided = np.zeros(trials, bool)
    passed, failed = np.zeros(trials, bool), np.zeros(trials, bool)
    n_stop = np.full(trials, looks[-1])
    for n, m, cj in zip(looks, inc, c):
        s += rng.standard_normal(trials) * math.sqrt(m) + m * (delta * TOL + TOL)
        z = s / math.sqrt(n)
        p, f = ~decided & (z >= cj), ~decided & (-z >= cj)
        passed |= p
        failed |= f
        futile_p |= TOL * s - n * TOL ** 2 / 2 <= low
        futile_f |= -TOL * s - n * TOL ** 2 / 2 <= low
        stop = ~decided & (p | f | (futile_p & futile_f))
        n_stop[stop] = n
        decided |= stop
    return {"PASS": passed.mean(), "FAIL": failed.mean(), "median": float(np.median(n_stop)), "mean": n_stop.mean()}


def design(rounds: int, overshoot: float) -> list[int]:
    per = math.ceil(overshoot * N_F / rounds)
    return [per * j for j in range(1, rounds + 1)]


def search(trials: int, rng: np.random.Generator) -> None:
    """Spending functions and look schedules (no futility stop): the median ratio at the design points, kept when
    power >= 0.795 at both (8,000 sequences leave +-0.009 at 2 SE)."""
    found = []
    for rounds in (16, 32):
        for cap in (1.1, 1.25, 1.5):
            for gamma in (1.0, 2.0, 3.0, 4.0):
                looks = design(rounds, cap)
                r0, r2 = (group_sequential(dl, trials, rng, looks, gamma) for dl in (0.0, -2.0))
                if r0["PASS"] >= 0.795 and r2["FAIL"] >= 0.795:
                    found.append((N_F / max(r0["median"], r2["median"]), rounds, cap, gamma, r0["PASS"], r2["FAIL"]))
    print(f"\n# schedule search, {trials} sequences per design point; kept: power >= 0.795 at Δ = 0 and -2 tol")
    print("| looks | cap (n_f) | HSD γ | P(PASS \\| 0) | P(FAIL \\| -2 tol) | fixed / median N, worse design point |")
    print("|---|---|---|---|---|---|")
    for ratio, rounds, cap, gamma, p0, f2 in sorted(found, reverse=True):
        print(f"| {rounds} | {cap:g} | {gamma:g} | {p0:.3f} | {f2:.3f} | {ratio:.2f}x |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=20_000)
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--search", type=int, default=0, help="also search schedules, this many sequences per point")
    a = ap.parse_args(argv)
    rng, t0 = np.random.default_rng(a.seed), time.time()
    print(f"# one metric, normal d, alpha {ALPHA}, power {1 - BETA}: fixed n_f = {N_F} items (the unit); "
          f"Wald's E[N] of the SPRT at its alternative = {wald_asn_design():.3f} n_f (fixed/SPRT {1 / wald_asn_design():.2f}x); "
          f"{a.trials} simulated sequences per cell")
    designs = {"gate: 16 looks to 1.25 n_f, HSD 1": (design(16, 1.25), 1.0, None),
               "32 looks to 1.5 n_f, HSD 3": (design(32, 1.5), 3.0, None),
               "gate + futility: 16 looks to 1.5 n_f, HSD 1, beta_f 0.2": (design(16, 1.5), 1.0, 0.2)}
    print("| Δ/tol | fixed PASS / FAIL | SPRT PASS / FAIL | SPRT median / mean N | fixed / SPRT median | "
          + " | ".join(f"{k}: PASS / FAIL, median N, ratio" for k in designs) + " |")
    print("|---|---|---|---|---|" + "---|" * len(designs))
    for dl in DELTAS:
        fx = group_sequential(dl, a.trials, rng, [N_F], 1.0)  # one look at alpha: the fixed design
        sp = sprt(dl, a.trials, rng)
        cells = []
        for looks, g, fut in designs.values():
            gs = group_sequential(dl, a.trials, rng, looks, g, fut)
            cells.append(f"{gs['PASS']:.3f} / {gs['FAIL']:.3f}, {gs['median'] / N_F:.2f}, {N_F / gs['median']:.2f}x")
        print(f"| {dl:+.1f} | {fx['PASS']:.3f} / {fx['FAIL']:.3f} | {sp['PASS']:.3f} / {sp['FAIL']:.3f} | "
              f"{sp['median'] / N_F:.2f} / {sp['mean'] / N_F:.2f} | {N_F / sp['median']:.2f}x (mean {N_F / sp['mean']:.2f}x) | "
              + " | ".join(cells) + " |", flush=True)
    if a.search:
        search(a.search, rng)
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
