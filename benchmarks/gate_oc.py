"""The gate's operating characteristic, simulated: P(PASS) and P(FAIL) against the true Delta,
for qverify's rule (fixed and sequential) and the anchors' rules on the same trials.

    python benchmarks/gate_oc.py [--trials 10000] [--plot docs/img/gate_oc.png] [--json oc.json] [--quick]

A trial draws a suite of n items from a population (each item's success probability p_i:
always right, always wrong, or unstable with p ~ U(0.15, 0.85)), a candidate whose true
population Delta is the operating point, and K replicates per build where replicate k of an
item shares its seed on both builds: with probability `coupling` the candidate's draw reuses
the baseline's uniform (common random numbers), else it is fresh. Damage is diffuse (every
item's p scaled down) or concentrated (a random share of items always wrong). Anchors, on
replicate 0 (one run per build, as they are used): recovery = round(c/b, 2) >= 0.95
(llm-compressor), |c - b| <= 0.08 b (vLLM rtol), c >= b - 1 point (one run, one threshold),
trigger-F1 of candidate run 1 vs baseline run 0 >= min F1 between baseline runs - 0.03 (K2VV).

Sequential vs fixed: the budgeted gate's looks at group-sequential levels (qverify.gate.boundaries),
first for one metric, then for whole gates of GATE_SUITES (a noisy, a stable, a ceiling suite and
a KL distance, one gated metric each) at several true states, against the fixed design that gives
every suite the one n the whole gate needs (as `qverify gate --limit n`): P(PASS), P(FAIL) and the
median requests per gate. Every rate is the share of `trials` independent simulated trials (or
gates); vectorised numpy, one core.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # oc_models, beside this script, also when loaded by path
from oc_models import (  # noqa: F401  (re-exported: tests/gate/test_oc.py and older callers read them here)
    ALPHA,
    GATE_STATES,
    GATE_SUITES,
    KLD_SELF,
    MODELS,
    SKEW_AT_MARGIN,
    TOL,
    Point,
    anchors,
    design_levels,
    draw,
    fixed,
    look_decisions,
    look_sizes,
    paired_d,
    population_mean,
    sequential,
    whole_gate,
)

from qverify.gate.boundaries import SPEND_GAMMA


def gate_design(n_fixed: int | None, trials: int, rng: np.random.Generator, first: int, rounds: int,
                gamma: float = SPEND_GAMMA) -> tuple[list[int], tuple]:
    looks = [n_fixed] if n_fixed else [first * j for j in range(1, rounds + 1)]
    if n_fixed:
        return looks, ([ALPHA], [ALPHA / len(GATE_SUITES)])
    return looks, design_levels(looks, ALPHA, gamma, len(GATE_SUITES))


def meets_targets(looks, levels, trials, rng) -> tuple[bool, float, float]:
    """P(gate PASS | all Δ=0) >= 0.8 and P(gate FAIL | toolcall -2 tol) >= 0.8."""
    a = whole_gate({}, trials, rng, looks, levels)["PASS"]
    z = whole_gate({"toolcall": -2.0}, trials, rng, looks, levels)["FAIL"]
    return a >= 0.8 and z >= 0.8, a, z


def grid(quick: bool) -> list[Point]:
    deltas = [0.0, -TOL / 2, -TOL, -1.5 * TOL, -2 * TOL]
    sizes = [(60, 3), (300, 3), (1500, 1), (1500, 3)] if not quick else [(300, 3)]
    out = [Point(dl, n, k, cp, dm) for n, k in sizes for cp in (0.0, 0.9) for dm in ("diffuse", "concentrated")
           for dl in deltas]
    out += [Point(dl, n, 3, 0.9, "concentrated", "ceiling") for n in ((60, 300, 1500) if not quick else (300,))
            for dl in (0.0, -0.05)]
    out += [Point(dl, 20, 3, 0.5, "diffuse", "stable") for dl in (0.0, -2 * TOL)]  # few items
    return out


def size_for_targets(pt: Point, trials: int, rng: np.random.Generator, sizes: list[int]) -> int | None:
    """Smallest n with P(PASS | 0) >= 0.8 and P(FAIL | -2 tol) >= 0.8 (fixed rule)."""
    for n in sizes:
        a = fixed(Point(0.0, n, pt.k, pt.coupling, pt.damage, pt.model), trials, rng)
        z = fixed(Point(-2 * TOL, n, pt.k, pt.coupling, pt.damage, pt.model), trials, rng)
        if a["PASS"] >= 0.8 and z["FAIL"] >= 0.8:
            return n
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="one size per table (smoke runs)")
    ap.add_argument("--plot", default=None, help="write the OC curves (matplotlib) to this PNG")
    ap.add_argument("--json", default=None)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--only-sequential", action="store_true", help="skip the fixed-design grid")
    ap.add_argument("--issue29", action="store_true", help="only the issue-29 rows (benchmarks/gate_oc_rows.py)")
    ap.add_argument("--default-plan", action="store_true", help="only issue 29's whole budgeted gates at the default plan")
    ap.add_argument("--sequence-trials", type=int, default=0, help="also gate this many trials per state through "
                                                                     "run_sequence (benchmarks/gate_oc_sequence.py)")
    a = ap.parse_args(argv)
    if a.default_plan:
        from gate_oc_rows import default_plan_rows

        default_plan_rows(a.trials, np.random.default_rng(a.seed), a.sequence_trials)
        return 0
    if a.issue29:
        from gate_oc_rows import issue29_rows

        issue29_rows(a.trials, np.random.default_rng(a.seed), a.sequence_trials)
        return 0
    rng = np.random.default_rng(a.seed)
    t0 = time.time()
    rows = []
    print(f"# fixed design: P(PASS) / P(FAIL) of qverify's rule, P(pass) of the anchors; {a.trials} trials per row, "
          f"tol {TOL}, alpha {ALPHA}")
    print("| model | damage | coupling | n | K | Δ/tol | qverify PASS | qverify FAIL | recovery | rtol | 1 pt | K2VV |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for pt in ([] if a.only_sequential else grid(a.quick)):
        r = fixed(pt, a.trials, rng)
        rows.append({**asdict(pt), **r, "trials": a.trials})
        anc = [f"{r[x]:.3f}" if x in r else "-" for x in ("recovery>=0.95", "rtol 0.08", "1 run, 1 point", "K2VV F1 floor")]
        print(f"| {pt.model} | {pt.damage} | {pt.coupling} | {pt.n} | {pt.k} | {pt.delta / TOL:+.1f} | {r['PASS']:.3f} | "
              f"{r['FAIL']:.3f} | " + " | ".join(anc) + " |", flush=True)
    seq = sequential_vs_fixed(a.trials, rng, a.quick)
    seq["gate"] = gate_vs_fixed(a.trials, rng, a.quick)
    _targets(rows, seq)
    if a.plot and rows:
        plot(rows, a.plot)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"fixed": rows, "sequential": seq}, f, indent=1)
    print(f"# {time.time() - t0:.0f} s", file=sys.stderr)
    return 0


ROUNDS, OVERSHOOT = 16, 1.25  # the sequential design: 16 rounds of n1 items, up to 1.25x the fixed design's n


def sequential_vs_fixed(trials: int, rng: np.random.Generator, quick: bool) -> dict:
    """One metric: fixed n for the power targets, then the sequential design (ROUNDS rounds of n1 items, up to
    OVERSHOOT x n, group-sequential levels) on the same model: P(PASS), P(FAIL) and requests compared."""
    base = Point(0.0, 0, 3, 0.5, "diffuse", "noisy")
    sizes = [150, 200, 225, 250, 275, 300, 350, 400, 500, 600, 800] if not quick else [300, 600]
    n_fixed = size_for_targets(base, max(trials // 5, 2000), rng, sizes)
    if n_fixed is None:
        return {"n_fixed": None}
    per = -(-int(OVERSHOOT * n_fixed) // ROUNDS)
    print(f"\n# one metric, sequential vs fixed (model noisy, diffuse, coupling 0.5, K 3): the fixed design needs n = "
          f"{n_fixed} items ({2 * 3 * n_fixed} requests, both builds) for P(PASS|0) >= 0.8 and P(FAIL|-2 tol) >= 0.8; "
          f"sequential: {ROUNDS} rounds of {per} items (at most {ROUNDS * per}), HSD(gamma {SPEND_GAMMA:g}) spending; "
          f"{trials} trials per row")
    out = {"n_fixed": n_fixed, "rounds_of": per, "max_items": ROUNDS * per, "rows": []}
    cases = [("noisy", dl) for dl in (0.0, -TOL / 2, -TOL, -1.5 * TOL, -2 * TOL, -4 * TOL)]
    cases += [("stable", 0.0), ("stable", -2 * TOL), ("ceiling", 0.0), ("ceiling", -0.05), ("kld", 0.0), ("kld", -2 * TOL)]
    print("| suite model | Δ/tol | fixed PASS | fixed FAIL | fixed requests | seq PASS | seq FAIL | seq median requests | "
          "seq mean | ratio (fixed/seq median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for model, dl in cases:
        pt = Point(dl, n_fixed, 3, *{"ceiling": (0.9, "concentrated"), "kld": (0.0, "diffuse")}.get(model, (0.5, "diffuse")),
                   model)
        fx = sequential(pt, trials, rng, n_fixed, n_fixed, n_fixed)  # one look: the fixed design
        sq = sequential(pt, trials, rng, first=per, per_round=per, max_items=ROUNDS * per)
        ratio = 2 * 3 * n_fixed / sq["median_requests"]
        out["rows"].append({"model": model, "delta": dl, "fixed": fx, "seq": sq, "ratio": ratio, "trials": trials})
        print(f"| {model} | {dl / TOL:+.1f} | {fx['PASS']:.3f} | {fx['FAIL']:.3f} | {2 * 3 * n_fixed} | {sq['PASS']:.3f} | "
              f"{sq['FAIL']:.3f} | {sq['median_requests']:.0f} | {sq['mean_requests']:.0f} | {ratio:.2f} |", flush=True)
    return out


def gate_vs_fixed(trials: int, rng: np.random.Generator, quick: bool) -> dict:
    """Whole gates of GATE_SUITES: the fixed design (one n for every suite, the smallest that meets the targets
    for the whole gate) against the sequential one (ROUNDS rounds of n1 = OVERSHOOT n / ROUNDS items per suite)."""
    sizes = list(range(300, 481, 20)) if not quick else [400]
    n_fixed = None
    for n in sizes:
        if meets_targets(*gate_design(n, 0, rng, 0, 0), max(trials // 2, 1000), rng)[0]:
            n_fixed = n
            break
    if n_fixed is None:
        return {"n_fixed": None}
    per = -(-int(OVERSHOOT * n_fixed) // ROUNDS)
    fx_design, sq_design = gate_design(n_fixed, 0, rng, 0, 0), gate_design(None, 0, rng, per, ROUNDS)
    fixed_req = 2 * 3 * n_fixed * len(GATE_SUITES)
    print(f"\n# whole gates ({', '.join(f'{k}: {v.model}' for k, v in GATE_SUITES.items())}; one gated metric each, "
          f"K 3): the fixed design needs n = {n_fixed} items in every suite ({fixed_req} requests per gate) for "
          f"P(gate PASS | all Δ=0) >= 0.8 and P(gate FAIL | toolcall -2 tol) >= 0.8 (FAIL family-wise: Holm); "
          f"sequential: {ROUNDS} rounds of {per} items per open suite, HSD(gamma {SPEND_GAMMA:g}); {trials} trials per row")
    print("| true state | fixed PASS | fixed FAIL | fixed requests | seq PASS | seq FAIL | seq median requests | seq mean | "
          "ratio (fixed/seq median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    out = {"n_fixed": n_fixed, "rounds_of": per, "rounds": ROUNDS, "fixed_requests": fixed_req, "rows": []}
    for label, state in GATE_STATES[: 2 if quick else None]:
        fx, sq = whole_gate(state, trials, rng, *fx_design), whole_gate(state, trials, rng, *sq_design)
        ratio = fixed_req / sq["median_requests"]
        out["rows"].append({"state": label, "fixed": fx, "seq": sq, "ratio": ratio, "trials": trials})
        print(f"| {label} | {fx['PASS']:.3f} | {fx['FAIL']:.3f} | {fixed_req} | {sq['PASS']:.3f} | {sq['FAIL']:.3f} | "
              f"{sq['median_requests']:.0f} | {sq['mean_requests']:.0f} | {ratio:.2f} |", flush=True)
    return out


def _targets(rows: list[dict], seq: dict) -> None:
    def worst(pred, key):
        sel = [r[key] for r in rows if pred(r)]
        return max(sel) if sel else float("nan")

    if rows:
        mc = 2 * np.sqrt(0.05 * 0.95 / rows[0]["trials"])
        print(f"\n# targets (max over the grid rows that apply; a level-0.05 test at its boundary reads 0.05 +- {mc:.3f} "
              f"here, 2 Monte Carlo SE)")
        print(f"P(FAIL | Δ=0) <= 0.05: {worst(lambda r: r['delta'] == 0, 'FAIL'):.3f}")
        print(f"P(PASS | Δ=-tol) <= 0.05: {worst(lambda r: abs(r['delta'] + TOL) < 1e-12, 'PASS'):.3f}")
        print(f"P(PASS | ceiling, 5% item loss) <= 0.05: "
              f"{worst(lambda r: r['model'] == 'ceiling' and r['delta'] < 0, 'PASS'):.3f}")
    if seq.get("rows"):
        r0, r2 = seq["rows"][0], seq["rows"][4]
        print(f"one metric (noisy) at the design points: P(PASS|0) {r0['seq']['PASS']:.3f} (seq) / "
              f"{r0['fixed']['PASS']:.3f} (fixed), P(FAIL|-2tol) {r2['seq']['FAIL']:.3f} / {r2['fixed']['FAIL']:.3f}; "
              f"fixed/sequential median requests {r0['ratio']:.2f} (Δ=0), {r2['ratio']:.2f} (Δ=-2tol)")
    g = seq.get("gate") or {}
    if g.get("rows"):
        ratios = [r["ratio"] for r in g["rows"]]
        r0, r2 = g["rows"][0], g["rows"][1]
        print(f"whole gate: fixed/sequential median requests per gate {r0['ratio']:.2f} (all Δ=0), {r2['ratio']:.2f} "
              f"(toolcall -2 tol); median over the {len(ratios)} states {float(np.median(ratios)):.2f} (range "
              f"{min(ratios):.2f}-{max(ratios):.2f}); target >= 2")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    sel = [r for r in rows if r["model"] == "noisy" and r["coupling"] == 0.9 and r["damage"] == "diffuse"]
    for (n, k) in sorted({(r["n"], r["k"]) for r in sel}):
        rs = sorted((r for r in sel if r["n"] == n and r["k"] == k), key=lambda r: -r["delta"])
        x = [r["delta"] / TOL for r in rs]
        axes[0].plot(x, [r["PASS"] for r in rs], "-o", label=f"PASS n={n} K={k}")
        axes[0].plot(x, [r["FAIL"] for r in rs], "--s", label=f"FAIL n={n} K={k}")
    big = [r for r in sel if r["n"] == max(r2["n"] for r2 in sel) and r["k"] == max(r2["k"] for r2 in sel)]
    big = sorted(big, key=lambda r: -r["delta"])
    for key in ("recovery>=0.95", "rtol 0.08", "1 run, 1 point", "K2VV F1 floor", "PASS"):
        axes[1].plot([r["delta"] / TOL for r in big], [r.get(key, np.nan) for r in big], "-o",
                     label="qverify PASS" if key == "PASS" else f"{key}: pass")
    for ax, title in zip(axes, ("qverify: P(PASS), P(FAIL)", f"P(pass) on the same trials (n={big[0]['n']})")):
        ax.axhline(0.05, color="grey", lw=0.8, ls=":")
        ax.axhline(0.8, color="grey", lw=0.8, ls=":")
        ax.axvline(-1, color="red", lw=0.8, ls=":")
        ax.set_xlabel("true Δ / tolerance")
        ax.set_title(title)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("probability")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())
