"""Issue 29's operating-characteristic rows: `python benchmarks/gate_oc.py --issue29 [--trials 10000]`.

Item models unlike the rule's assumptions, through the functions run_gate calls (qverify.gate.bounds.paired_bounds
via gate_oc.fixed / look_decisions; rule.measure for the capped KL): U-shaped Beta(0.3, 0.3) per-item success,
concentrated / diffuse / mixed damage, correlated replicates, small suites, heavy-tailed per-item KL, and whole
budgeted gates at the default plan (qverify.gate.plan_size). Every rate is the share of `trials` independent trials.
Targets: P(FAIL | 0) <= 0.05, P(PASS | -tol) <= 0.05; power rows P(PASS | 0) and P(FAIL | -2 tol) >= 0.8.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ holds the heavy-tailed KL item model

import numpy as np
from oc_models import GATE_SUITES, TOL, Point, design_levels, fixed, whole_gate

from qverify.gate.boundaries import SPEND_GAMMA
from qverify.suites.kld import KLD_CAP
from tests.synth import KL_SELF, KL_TOL, kl_bounds


def kl_rates(family: str, shape: float, excess: float, n: int, trials: int, rng: np.random.Generator) -> dict:
    b, m = kl_bounds(family, shape, excess, n, trials, rng)
    return {"PASS": float(np.mean(b.lower > -KL_TOL)), "FAIL": float(np.mean(b.upper < -KL_TOL)), "raw_mean": m}


def issue29_rows(trials: int, rng: np.random.Generator, sequence_trials: int = 0) -> None:
    print(f"# issue 29 rows; {trials} independent trials per rate; alpha 0.05\n")
    print("| row | model | damage | coupling | rep corr | n | K | tol | P(FAIL|0) | P(PASS|-tol) | P(PASS|0) | P(FAIL|-2tol) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    cases = [("heterogeneous", "ushaped", dm, 0.5, 0.0, 300, TOL) for dm in ("diffuse", "concentrated", "mixed")]
    cases += [("correlated replicates", "noisy", "mixed", 0.5, 0.7, 300, TOL),
              ("correlated replicates", "ushaped", "concentrated", 0.0, 0.7, 300, TOL)]
    cases += [("small suite", mdl, dm, cp, 0.0, 40, 0.10) for mdl, dm, cp in
              (("ushaped", "concentrated", 0.0), ("ushaped", "mixed", 0.5), ("noisy", "diffuse", 0.5),
               ("stable", "concentrated", 0.0))]
    for row, mdl, dm, cp, rc, n, tol in cases:
        r = {dl: fixed(Point(dl * tol, n, 3, cp, dm, mdl, rc), trials, rng, tol=tol) for dl in (0.0, -1.0, -2.0)}
        print(f"| {row} | {mdl} | {dm} | {cp} | {rc} | {n} | 3 | {tol} | {r[0.0]['FAIL']:.4f} | {r[-1.0]['PASS']:.4f} | "
              f"{r[0.0]['PASS']:.3f} | {r[-2.0]['FAIL']:.3f} |", flush=True)
    print("\n# kld/kld, heavy-tailed per-item KL (capped at the cap, exact betting bound); excess of the capped mean;"
          f" tol {KL_TOL}, cap {KLD_CAP}, baseline own KL Gamma(0.5) mean {KL_SELF}")
    print("| per-item KL | n | raw mean at excess tol | P(FAIL|0) | P(PASS|excess tol) | P(PASS|0) | P(FAIL|2 tol) |")
    print("|---|---|---|---|---|---|---|")
    for fam, shape in (("lognormal", 1.0), ("lognormal", 2.0), ("pareto", 2.5), ("pareto", 3.5)):
        for n in (100, 300):
            r0, r1, r2 = (kl_rates(fam, shape, e * KL_TOL, n, trials, rng) for e in (0.0, 1.0, 2.0))
            print(f"| {fam} {shape} | {n} | {r1['raw_mean']:.4f} | {r0['FAIL']:.4f} | {r1['PASS']:.4f} | {r0['PASS']:.3f} | "
                  f"{r2['FAIL']:.3f} |", flush=True)
    default_plan_rows(trials, rng, sequence_trials)


def default_plan_rows(trials: int, rng: np.random.Generator, sequence_trials: int = 0) -> None:
    """Whole budgeted gates at the plan `qverify gate --recipe R` makes with no qverify.toml: J looks (plan_size on
    the embedded default's suites), rounds of 60, FAIL family-wise over its 15 gated metrics. The rates come from
    gate_oc.whole_gate (paired_bounds at design_levels, as run_gate at each look); with sequence_trials, the same
    states are also gated through run_sequence itself (gate_oc_sequence.py), as a check of that shortcut."""
    from gate_oc_sequence import BYSTANDERS, FIRST, default_rounds, whole_gates

    rounds = default_rounds()
    family = len(GATE_SUITES) + BYSTANDERS
    looks = [FIRST * j for j in range(1, rounds + 1)]
    levels = design_levels(looks, 0.05, SPEND_GAMMA, family)
    print(f"\n# whole budgeted gates at the default plan ({rounds} looks, rounds of {FIRST} items per open suite, "
          f"suites {', '.join(f'{k}: {v.model}' for k, v in GATE_SUITES.items())}, tol {TOL}, FAIL family {family})")
    print("| true state | trials | P(PASS) | P(FAIL) | median requests | run_sequence trials | P(PASS) | P(FAIL) |")
    print("|---|---|---|---|---|---|---|---|")
    for label, state, k in (("all Δ=0", {}, 1), ("toolcall -tol/2", {"toolcall": -0.5}, 1), ("toolcall -tol", {"toolcall": -1.0}, 5),
                            ("toolcall -2 tol", {"toolcall": -2.0}, 1), ("all -2 tol", {s: -2.0 for s in GATE_SUITES}, 1)):
        w = whole_gate(state, trials * k, rng, looks, levels)  # the rate compared with 5%: 5x the trials
        seq = "| 0 | - | -"
        if sequence_trials:
            r = whole_gates(state, sequence_trials, rng, rounds)
            seq = f"| {sequence_trials} | {r['PASS']:.3f} | {r['FAIL']:.3f}"
        print(f"| {label} | {trials * k} | {w['PASS']:.4f} | {w['FAIL']:.4f} | {w['median_requests']:.0f} {seq} |",
              flush=True)
