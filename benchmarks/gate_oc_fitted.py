"""Whole budgeted gates at the default plan on item models fitted to the embedded suites' measured per-item
variances, coding at its real 200-item source: `python benchmarks/gate_oc_fitted.py [--trials 200]` (issue 35.3).

The fit: per suite, each item's success probability p_i ~ Beta(a, b) with the mean m and between-item variance
Var(p) of docs/gate-results.md's "Gate efficiency" table (the embedded bf16 build, 60 held-out items x 6
replicates): m (1 - m) = Var(p) + E[p (1 - p)] gives m (the root above 1/2, as the measured baselines are), and
a + b = m (1 - m) / Var(p) - 1. toolcall: Var 0.119, E[p(1-p)] 0.104 (twice the "noisy" model's within
variance); verifier: 0.068 / 0.158; longctx: 0.212 / 0.014; coding: at its ceiling (every sample passed), 200
items. Half the replicate seeds are shared between the builds (coupling 0.5), as gate_oc's models. kld keeps
gate_oc's KL model (heavy-tailed Gamma(0.5) per-item KL). The design's own model (gate_oc_sequence.py's
GATE_SUITES: noisy / stable / ceiling / kld with unlimited items) is printed beside.

One trial is one qverify.gate.budget.run_sequence, as gate_oc_sequence.py's, with replicate-level outcomes so that
a finite source's rounds of more replicates (budget.py) see new data: coding runs out at 200 items and goes on
with replicates. Bystanders: the default's other gated metrics, PASSed at look 1 (gate_oc_sequence.BYSTANDERS).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_oc_sequence import default_rounds, look_report
from oc_models import ALPHA, KLD_SELF, TOL

from qverify.gate.boundaries import LookLevels
from qverify.gate.budget import make_plan, run_sequence
from qverify.gate.rule import Evidence
from qverify.models import GateReport

FIT = {"toolcall": (0.119, 0.104), "verifier": (0.068, 0.158), "longctx": (0.212, 0.014)}  # (Var(p), E[p(1-p)])
SUPPLY = {"coding": 200}
FIRST, K, KMAX = 60, 3, 36
OUT = Path(__file__).resolve().parent / "results" / "gate_oc_fitted.txt"


def beta_params(var: float, within: float) -> tuple[float, float]:
    mm = var + within
    m = 0.5 + np.sqrt(max(0.25 - mm, 0.0))
    s = mm / var - 1
    return m * s, (1 - m) * s


def outcomes(suite: str, delta: float, damage: str, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(baseline, candidate) 0/1, n x KMAX; the candidate's population mean lower by -delta."""
    if suite == "coding":
        p = np.ones(n)
    else:
        p = rng.beta(*beta_params(*FIT[suite]), n)
    share = -delta / p.mean() if p.mean() > 0 else 0.0
    q = np.where(rng.random(n) < share, 0.0, p) if damage == "concentrated" else p * (1 - share)
    ub = rng.random((n, KMAX))
    uc = np.where(rng.random((n, KMAX)) < 0.5, ub, rng.random((n, KMAX)))
    return (ub < p[:, None]).astype(float), (uc < q[:, None]).astype(float)


def one_gate(state: dict[str, float], damage: str, rounds: int, rng: np.random.Generator, root: Path) -> tuple[str, int]:
    suites = ["toolcall", "verifier", "longctx", "coding", "kld"]
    nmax = FIRST * rounds
    data = {s: outcomes(s, state.get(s, 0.0) * TOL, damage, min(nmax, SUPPLY.get(s, nmax)), rng)
            for s in suites if s != "kld"}
    own = rng.gamma(0.5, KLD_SELF * TOL / 0.5, nmax)
    kl = rng.gamma(0.5, (KLD_SELF * TOL - state.get("kld", 0.0) * TOL) / 0.5, nmax)
    first = {s: FIRST for s in suites}
    plan = make_plan(suites, first, K, 2, ALPHA, str(rounds * sum(first.values()) * K * 2))
    have, reps = {}, {}

    def evaluate(builds, want, more=None):
        got = {s: min(n, SUPPLY.get(s, nmax)) for s, n in want.items()}
        have.update(got)
        reps.update({s: (more or {}).get(s, K) for s in want})
        return [dict(got) for _ in builds]

    def gate(open_suites: list[str], look: LookLevels) -> GateReport:
        evs = []
        for s in open_suites:
            n = have[s]
            if s == "kld":
                evs.append(Evidence("kld/m", "higher", TOL, -(kl[:n] - own[:n])))
                continue
            b, c = data[s]
            k = min(reps.get(s, K), KMAX)
            evs.append(Evidence(f"{s}/m", "higher", TOL, c[:n, :k].mean(1) - b[:n, :k].mean(1), bounded=True))
        return look_report(evs, look)

    report, looks = run_sequence(root, "base", ["cand"], plan, evaluate, gate)
    return report.verdict, looks[-1].requests


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--seed", type=int, default=353)
    ap.add_argument("--states", default="zero,half,minus2d,minus2c,minus1,minus1d")
    ap.add_argument("--out", type=Path, default=OUT, help="the results file appended to")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    rounds = default_rounds()
    states = {"zero": ("all Δ=0", {}, "diffuse", 1), "half": ("toolcall -tol/2", {"toolcall": -0.5}, "diffuse", 1),
              "minus2d": ("toolcall -2 tol, diffuse", {"toolcall": -2.0}, "diffuse", 1),
              "minus2c": ("toolcall -2 tol, concentrated", {"toolcall": -2.0}, "concentrated", 1),
              "minus1": ("toolcall -tol, concentrated (level)", {"toolcall": -1.0}, "concentrated", 2),
              "minus1d": ("toolcall -tol, diffuse (level)", {"toolcall": -1.0}, "diffuse", 2)}
    a.out.parent.mkdir(exist_ok=True)
    with open(a.out, "a") as f:
        f.write(f"\n# gate_oc_fitted.py {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, seed {a.seed}: "
                f"{rounds} looks of {FIRST} items (coding 200 then replicates), run_sequence per trial\n"
                "| true state | P(PASS) | P(FAIL) | median requests | trials |\n|---|---|---|---|---|\n")
    for key in a.states.split(","):
        label, state, damage, mult = states[key]
        t0, v, req = time.time(), [], []
        with tempfile.TemporaryDirectory() as tmp:
            for t in range(a.trials * mult):
                verdict, r = one_gate(state, damage, rounds, rng, Path(tmp) / str(t))
                v.append(verdict)
                req.append(r)
        v = np.asarray(v)
        line = (f"| {label} | {np.mean(v == 'PASS'):.3f} | {np.mean(v == 'FAIL'):.3f} | {np.median(req):.0f} | "
                f"{len(v)} |")
        print(line, f"({time.time() - t0:.0f} s)", flush=True)
        with open(a.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
