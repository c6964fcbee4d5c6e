"""Why the per-look t bound FAILs slightly more than alpha at Delta = -tol: measured, variant by variant.

    OMP_NUM_THREADS=1 python benchmarks/gate_t_accuracy.py [--trials 40000]

Same trials (benchmarks/gate_oc.py's item model) for every column; Delta = -tol, so every rate should read
alpha. Columns, FAIL / PASS at any look:

* plain t: mean -+ t_{n-1} SE, no skewness correction (the rule before Hall's correction);
* qverify: the shipped bound (qverify.gate.bounds.paired_bounds: Hall 1992 with the sample skewness g,
  Satterthwaite df from the sample kurtosis, and the exact discordance bound when < 20 items changed);
* Hall, true skew: Hall's transform with the population skewness of d (n-1 df) - not computable from data,
  it says whether the transform's form is right and its plug-in estimate is what misses;
* null-tilted: Hall with the skewness tilted to the bound it makes (g -+ (k - 1.5 g^2) q / sqrt n, k the
  excess kurtosis; the first-order exponential tilt of the sample to mean = the bound; tried, not adopted).

Then E[g | W] in the tails: with mostly-zero differences (excess kurtosis 5-70) the sample skewness moves
with the sample mean, cov(g, W) ~ (k - 1.5 g^2)/sqrt n (delta method), so in the tail a test rejects in,
g is about twice the true skewness and Hall's correction over-corrects there.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats as sps

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gate_oc as oc  # noqa: E402

from qverify.gate.boundaries import nominal_levels  # noqa: E402
from qverify.gate.bounds import _g, paired_bounds  # noqa: E402
from qverify.gate.sequential import look_sizes  # noqa: E402

TEN = look_sizes(100, 100, 1000)
ROWS = [  # (label, model, damage, coupling, looks, alpha)
    ("1 look n=100", "noisy", "diffuse", 0.0, [100], 0.05),
    ("1 look n=250", "noisy", "diffuse", 0.5, [250], 0.05),
    ("1 look n=500", "noisy", "diffuse", 0.5, [500], 0.05),
    ("1 look n=500", "noisy", "diffuse", 0.5, [500], 0.01),
    ("10 looks", "noisy", "diffuse", 0.0, TEN, 0.05),
    ("10 looks", "noisy", "diffuse", 0.5, TEN, 0.05),
    ("10 looks", "noisy", "diffuse", 0.9, TEN, 0.05),
    ("10 looks", "noisy", "concentrated", 0.9, TEN, 0.05),
    ("10 looks", "stable", "diffuse", 0.5, TEN, 0.05)]
NAMES = ("plain t", "qverify", "Hall, true skew", "null-tilted")


def moments(d: np.ndarray) -> tuple[np.ndarray, ...]:
    n = d.shape[-1]
    m, sd = d.mean(-1), d.std(-1, ddof=1)
    c = d - m[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        g = np.nan_to_num(np.where(sd > 0, (c ** 3).mean(-1) / sd ** 3, 0.0))
        k = np.nan_to_num(np.where(sd > 0, (c ** 4).mean(-1) / sd ** 4 - 3, 0.0))
        w = np.nan_to_num((m + oc.TOL) / (sd / np.sqrt(n)), nan=0.0, posinf=50.0, neginf=-50.0)
    return w, g, k, np.maximum(2 / (2 / (n - 1) + np.clip(k, 0, None) / n), 1.0)


def decisions(d: np.ndarray, level: float, g_true: float, bounded: bool) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(FAIL, PASS) per trial at one look, for each variant."""
    n = d.shape[-1]
    w, g, k, df = moments(d)
    r = np.sqrt(n)
    q1, qs = sps.t.ppf(1 - level, n - 1), sps.t.ppf(1 - level, df)
    b = paired_bounds(d, oc.TOL, level, bounded=bounded, exact_p=False)
    ht = _g(w, g_true / (3 * r), g_true / (6 * r))
    shift = (k - 1.5 * g * g) * qs / r
    hf, hp = _g(w, (g + shift) / (3 * r), (g + shift) / (6 * r)), _g(w, (g - shift) / (3 * r), (g - shift) / (6 * r))
    return {"plain t": (w < -q1, w > q1), "qverify": (b.upper < -oc.TOL, b.lower > -oc.TOL),
            "Hall, true skew": (ht < -q1, ht > q1), "null-tilted": (hf < -qs, hp > qs)}


def row(model: str, damage: str, coupling: float, looks: list[int], alpha: float, trials: int,
        rng: np.random.Generator, chunk: int = 2000) -> tuple[dict[str, list[float]], float]:
    pt = oc.Point(-oc.TOL, 0, 3, coupling, damage, model)
    pop, _ = oc.paired_d(pt, 50, np.random.default_rng(0), 20_000)
    g_true = float(sps.skew(pop.ravel()))
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
    return out, g_true


def conditional_skew(trials: int, rng: np.random.Generator) -> None:
    pt = oc.Point(-oc.TOL, 0, 3, 0.5, "diffuse", "noisy")
    pop, _ = oc.paired_d(pt, 50, np.random.default_rng(0), 20_000)
    print(f"\n# the sample skewness g moves with the sample mean (noisy, diffuse, coupling 0.5, Δ = -tol; population "
          f"skew {sps.skew(pop.ravel()):+.2f}, excess kurtosis {sps.kurtosis(pop.ravel()):.1f}; {trials} trials)")
    print("| n | W = (mean + tol)/SE in | trials | mean W | mean g |\n|---|---|---|---|---|")
    d, _ = oc.paired_d(pt, trials, rng, 500)
    for n in (100, 500):
        w, g, _, _ = moments(d[:, :n])
        for lo, hi in ((-9, -2), (-0.5, 0.5), (2, 9)):
            s = (w >= lo) & (w < hi)
            print(f"| {n} | [{lo}, {hi}) | {s.sum()} | {w[s].mean():+.2f} | {g[s].mean():+.3f} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=40_000)
    ap.add_argument("--seed", type=int, default=7)
    a = ap.parse_args(argv)
    rng, t0 = np.random.default_rng(a.seed), time.time()
    mc = 2 * np.sqrt(0.05 * 0.95 / a.trials)
    print(f"# P(FAIL) / P(PASS) at Δ = -tol, each at level alpha (over all looks: HSD(1) group-sequential levels); "
          f"{a.trials} trials per row, the same trials in every column; 2 MC SE at 0.05: {mc:.4f}")
    print("| looks | model | damage | coupling | alpha | true skew | " + " | ".join(f"{k} FAIL / PASS" for k in NAMES) + " |")
    print("|---|---|---|---|---|---|" + "---|" * len(NAMES))
    for label, model, damage, coupling, looks, alpha in ROWS:
        r, g = row(model, damage, coupling, looks, alpha, a.trials, rng)
        print(f"| {label} | {model} | {damage} | {coupling} | {alpha} | {g:+.2f} | "
              + " | ".join(f"{r[k][0]:.4f} / {r[k][1]:.4f}" for k in NAMES) + " |", flush=True)
    conditional_skew(a.trials, rng)
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
