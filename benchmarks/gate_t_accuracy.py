"""The per-look t bound's level at Delta = -tol, before and after estimating its skewness at the margin.

    OMP_NUM_THREADS=1 python benchmarks/gate_t_accuracy.py [--trials 40000] [--gate 10000] [--grid 10000]

Same trials (benchmarks/gate_oc.py's item models) for every column. Columns:

* plain t: mean -+ t_{n-1} SE, no skewness correction;
* before: Hall's (1992) transform with the sample's own skewness g (+ Satterthwaite df, + the exact discordance
  bound below 20 changed items): the rule until 2026-12-01 (paired_bounds(..., skew_at_margin=False));
* after: the same with the skewness of the sample exponentially tilted to mean -tol (the shipped rule);
* Hall, true skew: Hall's transform with the population skewness of d (n-1 df): not computable from data; it
  shows whether the transform's form is right and its skewness estimate is what misses.

Then power at the fixed design's size, E[g | W] in the tails (the cause), and with --gate / --grid whole gates
and gate_oc.py's fixed grid at the margin, before and after. Every rate is a share of the stated trial count.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate_oc as oc
import oc_models  # where the simulation functions read SKEW_AT_MARGIN

from qverify.gate.boundaries import nominal_levels
from qverify.gate.bounds import _g, paired_bounds

TEN = oc.look_sizes(100, 100, 1000)
LEVEL_ROWS = [  # (label, model, damage, coupling, looks, alpha)
    ("1 look n=100", "noisy", "diffuse", 0.0, [100], 0.05),
    ("1 look n=250", "noisy", "diffuse", 0.5, [250], 0.05),
    ("1 look n=500", "noisy", "diffuse", 0.5, [500], 0.01),
    ("10 looks", "noisy", "diffuse", 0.0, TEN, 0.05),
    ("10 looks", "noisy", "diffuse", 0.5, TEN, 0.05),
    ("10 looks", "noisy", "diffuse", 0.9, TEN, 0.05),
    ("10 looks", "noisy", "concentrated", 0.9, TEN, 0.05),
    ("10 looks", "stable", "diffuse", 0.5, TEN, 0.05),
    ("10 looks", "kld", "diffuse", 0.0, TEN, 0.05)]
POWER_ROWS = [("noisy", 0.0), ("noisy", -2.0), ("stable", 0.0), ("stable", -2.0), ("kld", 0.0), ("kld", -2.0)]
NAMES = ("plain t", "before", "after", "Hall, true skew")


def moments(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """W = (mean + tol)/SE and the sample skewness g, per trial."""
    n = d.shape[-1]
    m, sd = d.mean(-1), d.std(-1, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.nan_to_num(np.where(sd > 0, ((d - m[:, None]) ** 3).mean(-1) / sd ** 3, 0.0))
        w = np.nan_to_num((m + oc.TOL) / (sd / np.sqrt(n)), nan=0.0, posinf=50.0, neginf=-50.0)
    return w, g


def decisions(d: np.ndarray, level: float, g_true: float, bounded: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(FAIL, PASS) per trial at one look, for each variant."""
    n = d.shape[-1]
    w, _ = moments(d)
    q = sps.t.ppf(1 - level, n - 1)
    ht = _g(w, g_true / (3 * np.sqrt(n)), g_true / (6 * np.sqrt(n)))
    out = {"plain t": (w < -q, w > q), "Hall, true skew": (ht < -q, ht > q)}
    for key, at_margin in (("before", False), ("after", True)):
        b = paired_bounds(d, oc.TOL, level, bounded=bounded, skew_at_margin=at_margin)
        out[key] = (b.upper < -oc.TOL, b.lower > -oc.TOL)
    return out


def population_skew(pt: oc.Point) -> float:
    pop, _ = oc.paired_d(pt, 50, np.random.default_rng(0), 20_000)
    return float(sps.skew(pop.ravel()))


def rates(pt: oc.Point, looks: list[int], alpha: float, trials: int, rng: np.random.Generator,
          chunk: int = 1000) -> dict[str, list[float]]:
    """P(FAIL), P(PASS) at any look (HSD(1) group-sequential levels over several looks), per variant."""
    g_true = population_skew(pt)
    levels = nominal_levels(tuple(float(n) for n in looks), alpha) if len(looks) > 1 else (alpha,)
    out = {k: [0.0, 0.0] for k in NAMES}
    for s in range(0, trials, chunk):
        m = min(chunk, trials - s)
        d, bounded = oc.paired_d(pt, m, rng, looks[-1])
        state = {k: (np.zeros(m, bool), np.zeros(m, bool)) for k in NAMES}
        for n, lv in zip(looks, levels):
            for key, (f, p) in decisions(d[:, :n], lv, g_true, bounded).items():
                fa, pa = state[key]
                open_ = ~fa & ~pa
                fa |= open_ & f
                pa |= open_ & p & ~f
        for key, (fa, pa) in state.items():
            out[key][0] += fa.sum() / trials
            out[key][1] += pa.sum() / trials
    return out


def point(model: str, delta_tol: float) -> oc.Point:
    coupling, damage = {"kld": (0.0, "diffuse")}.get(model, (0.5, "diffuse"))
    return oc.Point(delta_tol * oc.TOL, 0, 3, coupling, damage, model)


def level_table(trials: int, rng: np.random.Generator) -> None:
    mc = 2 * np.sqrt(0.05 * 0.95 / trials)
    print(f"# P(FAIL) / P(PASS) at Δ = -tol, each test at level alpha (several looks: HSD(1) group-sequential levels, "
          f"looks at 100, 200, ..., 1000 items); {trials} trials per row, the same trials in every column; "
          f"2 MC SE at 0.05: {mc:.4f}")
    print("| looks | model | damage | coupling | alpha | true skew | " + " | ".join(f"{k} FAIL / PASS" for k in NAMES) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(NAMES))
    for label, model, damage, coupling, looks, alpha in LEVEL_ROWS:
        pt = oc.Point(-oc.TOL, 0, 3, coupling, damage, model)
        r = rates(pt, looks, alpha, trials, rng)
        print(f"| {label} | {model} | {damage} | {coupling} | {alpha} | {population_skew(pt):+.2f} | "
              + " | ".join(f"{r[k][0]:.4f} / {r[k][1]:.4f}" for k in NAMES) + " |", flush=True)


def power_table(trials: int, rng: np.random.Generator, n: int = 250) -> None:
    print(f"\n# power at the fixed design's size (n = {n}, K 3, one look at 0.05; noisy/stable coupling 0.5, kld 0); "
          f"{trials} trials per row")
    print("| model | Δ/tol | before PASS / FAIL | after PASS / FAIL |\n|---|---|---|---|")
    for model, dl in POWER_ROWS:
        r = rates(point(model, dl), [n], 0.05, trials, rng)
        print(f"| {model} | {dl:+.1f} | {r['before'][1]:.4f} / {r['before'][0]:.4f} | "
              f"{r['after'][1]:.4f} / {r['after'][0]:.4f} |", flush=True)


def conditional_skew(trials: int, rng: np.random.Generator) -> None:
    pt = oc.Point(-oc.TOL, 0, 3, 0.5, "diffuse", "noisy")
    pop, _ = oc.paired_d(pt, 50, np.random.default_rng(0), 20_000)
    print(f"\n# the cause: the sample skewness g moves with the sample mean (noisy, diffuse, coupling 0.5, Δ = -tol; "
          f"population skew {sps.skew(pop.ravel()):+.2f}, excess kurtosis {sps.kurtosis(pop.ravel()):.1f}; {trials} trials)")
    print("| n | W = (mean + tol)/SE in | trials | mean W | mean g |\n|---|---|---|---|---|")
    d, _ = oc.paired_d(pt, trials, rng, 500)
    for n in (100, 500):
        w, g = moments(d[:, :n])
        for lo, hi in ((-9, -2), (-0.5, 0.5), (2, 9)):
            s = (w >= lo) & (w < hi)
            print(f"| {n} | [{lo}, {hi}) | {s.sum()} | {w[s].mean():+.2f} | {g[s].mean():+.3f} |")


def before_after(fn) -> tuple[dict, dict]:
    out = []
    for at_margin in (False, True):
        oc_models.SKEW_AT_MARGIN = at_margin
        out.append(fn())
    oc_models.SKEW_AT_MARGIN = True
    return out[0], out[1]


def gate_table(gates: int) -> None:
    fx, sq = oc.gate_design(380, 0, None, 0, 0), oc.gate_design(None, 0, None, 30, 16)
    print(f"\n# whole gates (gate_oc.py's four suites; fixed: 380 items each, 9120 requests; sequential: 16 rounds of 30), "
          f"{gates} gates per cell, the same seed before and after")
    print("| true state | design | before PASS / FAIL | before median requests | after PASS / FAIL | after median requests |")
    print("|---|---|---|---|---|---|")
    for label, state in oc.GATE_STATES[:3]:
        for name, des in (("fixed", fx), ("sequential", sq)):
            b, a = before_after(lambda s=state, x=des: oc.whole_gate(s, gates, np.random.default_rng(31), *x))
            print(f"| {label} | {name} | {b['PASS']:.3f} / {b['FAIL']:.3f} | {b['median_requests']:.0f} | "
                  f"{a['PASS']:.3f} / {a['FAIL']:.3f} | {a['median_requests']:.0f} |", flush=True)


def one_metric_table(trials: int) -> None:
    """gate_oc.py's one-metric comparison at its design: fixed n = 250 against 16 rounds of 20 (HSD 1)."""
    print(f"\n# one metric (noisy, diffuse, coupling 0.5, K 3): fixed n = 250 (1500 requests) vs sequential 16 x 20 items; "
          f"{trials} trials per cell, the same seed before and after")
    print("| Δ/tol | design | before PASS / FAIL | before median requests | after PASS / FAIL | after median requests |")
    print("|---|---|---|---|---|---|")
    for dl in (0.0, -1.0, -2.0):
        pt = oc.Point(dl * oc.TOL, 250, 3, 0.5, "diffuse", "noisy")
        for name, args in (("fixed", (250, 250, 250)), ("sequential", (20, 20, 320))):
            b, a = before_after(lambda x=args, p=pt: oc.sequential(p, trials, np.random.default_rng(51), *x))
            print(f"| {dl:+.1f} | {name} | {b['PASS']:.3f} / {b['FAIL']:.3f} | {b['median_requests']:.0f} | "
                  f"{a['PASS']:.3f} / {a['FAIL']:.3f} | {a['median_requests']:.0f} |", flush=True)


def grid_table(trials: int) -> None:
    rows = [p for p in oc.grid(False) if abs(p.delta + oc.TOL) < 1e-12 or p.model != "noisy"]
    print(f"\n# gate_oc.py's fixed grid at the margin (and its ceiling and few-item rows), {trials} trials per row, "
          f"the same seed before and after")
    print("| model | damage | coupling | n | K | Δ/tol | before PASS / FAIL | after PASS / FAIL |\n|---|---|---|---|---|---|---|---|")
    for pt in rows:
        b, a = before_after(lambda p=pt: oc.fixed(p, trials, np.random.default_rng(41)))
        print(f"| {pt.model} | {pt.damage} | {pt.coupling} | {pt.n} | {pt.k} | {pt.delta / oc.TOL:+.1f} | "
              f"{b['PASS']:.4f} / {b['FAIL']:.4f} | {a['PASS']:.4f} / {a['FAIL']:.4f} |", flush=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40_000)
    ap.add_argument("--gate", type=int, default=0, help="also whole gates, this many per cell")
    ap.add_argument("--grid", type=int, default=0, help="also gate_oc.py's fixed grid at the margin, trials per row")
    ap.add_argument("--one", type=int, default=0, help="also gate_oc.py's one-metric fixed vs sequential, trials per cell")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--no-level", action="store_true", help="skip the level, power and cause tables")
    a = ap.parse_args(argv)
    rng, t0 = np.random.default_rng(a.seed), time.time()
    if not a.no_level:
        level_table(a.trials, rng)
        power_table(a.trials // 2, rng)
        conditional_skew(a.trials, rng)
    if a.gate:
        gate_table(a.gate)
    if a.one:
        one_metric_table(a.one)
    if a.grid:
        grid_table(a.grid)
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
