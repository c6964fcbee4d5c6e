"""Budgeted gates with a refused suite or an exhausted source: `python benchmarks/gate_oc_budget.py [--trials 1000]`.

Each trial is one `qverify gate --budget` sequence: qverify.gate.budget.run_sequence (its rounds, its state of every
look and its final verdict, as the CLI runs them) with each look decided as run_gate decides it: the run checks
(integrity.run_problems against error_budget, pair_problems) and then gate.gate_candidate on the runs that passed
them, at the look's group-sequential levels. Only the disk is left out: runs are built in memory as
gate.loader.RunData instead of written through RunStore and read back (tests/gate/test_budget.py runs that path;
it costs seconds per look, too slow for thousands of trials).

Two suites, each with one gated metric at tolerance 0.03 and 3 replicates: `coding` (items right always 60%, never
20%, half the time 20%; half the requests share the baseline's seed, as gate_oc.py's coupling 0.5), the suite that gets refused or runs out, and `longctx` (items always
right 70%, else never, the same for both builds: it PASSes by look 2, so a gate that forgot coding would PASS the
build). The plan is 4 rounds of 100 items.
Damage at -tol: a share of the always-right coding items is always wrong in the candidate (population Delta = -tol).
Target: no build PASS with an undecided or refused suite; P(PASS) <= 0.05 where a suite is truly at -tol.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from qverify.config import ERROR_BUDGET
from qverify.gate.boundaries import LookLevels
from qverify.gate.budget import make_plan, run_sequence
from qverify.gate.gate import gate_candidate
from qverify.gate.integrity import pair_problems, run_problems
from qverify.gate.loader import RunData
from qverify.models import GateReport, RunManifest, Sampling, ServingProfile, content_hash

K, FIRST, ROUNDS, TOL = 3, 100, 4, 0.03
KMAX = 8 * K
KEYS = {"coding": "pass@1", "longctx": "accuracy"}
DECLARED = {"coding/pass@1", "longctx/accuracy"}
NMAX = FIRST * ROUNDS


def coding_probs(rng: np.random.Generator) -> np.ndarray:
    u = rng.random(NMAX)
    return np.where(u < 0.6, 1.0, np.where(u < 0.8, 0.0, 0.5))


def run_data(build: str, suite: str, outcomes: np.ndarray, errors: np.ndarray, n: int) -> RunData:
    """What loader.load would read for the first n items: errors are NaN scores and count in n_errors."""
    ids = [f"{suite}-{i:05d}" for i in range(n)]
    x = np.where(errors[:n], np.nan, outcomes[:n])
    m = RunManifest(build_id=build, suite=suite, suite_version="1", item_set_hash=content_hash(ids), n_items=n,
                    replicates=K, sampling=Sampling(), serving=ServingProfile(), complete=True)
    k = outcomes.shape[1]
    m.replicates = k
    return RunData(build, suite, m, ids, list(range(k)), {KEYS[suite]: x}, n_results=n * k,
                   n_errors=int(errors[:n].sum()), errored=errors[:n])


class Trial:
    """One sequence's pre-drawn requests: outcomes[build][suite] is NMAX x K; errors likewise (True: an
    infrastructure error); available[suite] caps a finite source."""

    def __init__(self, rng: np.random.Generator, delta: float, error_rate: float, error_items: int | None,
                 available: dict[str, int]):
        pc = coding_probs(rng)
        worse = pc.copy()
        worse[(pc == 1.0) & (rng.random(NMAX) < -delta / 0.6)] = 0.0  # E[Delta] = delta (0.6: always-right share)
        u = rng.random((NMAX, KMAX))  # KMAX replicates: an exhausted source's rounds add replicates (budget.py)
        uc = np.where(rng.random((NMAX, KMAX)) < 0.5, u, rng.random((NMAX, KMAX)))  # coupling 0.5: half the seeds shared
        stable = np.repeat((rng.random(NMAX) < 0.7).astype(float)[:, None], KMAX, axis=1)
        self.outcomes = {"base": {"coding": (u < pc[:, None]).astype(float), "longctx": stable},
                         "cand": {"coding": (uc < worse[:, None]).astype(float), "longctx": stable}}
        none = np.zeros((NMAX, KMAX), bool)
        err = rng.random((NMAX, KMAX)) < error_rate
        if error_items is not None:  # errors only in the first round's items (an outage during round 1)
            err[error_items:] = False
        self.errors = {"base": {"coding": none, "longctx": none}, "cand": {"coding": err, "longctx": none}}
        self.available, self.have, self.reps = available, {}, {}

    def evaluate(self, builds: list[str], want: dict[str, int], more: dict[str, int] | None = None
                 ) -> list[dict[str, int]]:
        got = {s: min(n, self.available.get(s, NMAX)) for s, n in want.items()}
        self.have.update(got)
        self.reps.update({s: (more or {}).get(s, K) for s in want})
        return [dict(got) for _ in builds]

    def gate(self, open_suites: list[str], look: LookLevels) -> GateReport:
        """run_gate's per-candidate steps on in-memory runs (no build-dir checks: the builds are not on disk)."""
        runs = {b: {s: run_data(b, s, self.outcomes[b][s][:, :self.reps[s]], self.errors[b][s][:, :self.reps[s]],
                                self.have[s]) for s in open_suites} for b in ("base", "cand")}
        refused, ok = {}, []
        for s in open_suites:
            bad = run_problems(runs["base"][s], ERROR_BUDGET) + run_problems(runs["cand"][s], ERROR_BUDGET)
            bad += pair_problems(runs["base"][s], runs["cand"][s]) if not bad else []
            if bad:
                refused[s] = bad
            else:
                ok.append(s)
        c = gate_candidate("cand", "cand", {s: runs["base"][s] for s in ok}, {s: runs["cand"][s] for s in ok}, {},
                           refused=refused, look=look)
        gid = content_hash({"look": look.look, "n": self.have, "suites": open_suites}, 12)
        return GateReport(gate_id=gid, baseline="base", baseline_recipe="base", verdict=c.verdict, candidates=[c],
                          config={})


def one(rng: np.random.Generator, root: Path, row: dict) -> tuple[str, bool]:
    """(verdict, PASS with a declared metric undecided or a suite refused: the defect the target excludes)."""
    t = Trial(rng, row["delta"], row.get("error_rate", 0.0), row.get("error_items"), row.get("available", {}))
    first = {"coding": FIRST, "longctx": FIRST}
    plan = make_plan(["coding", "longctx"], first, K, 2, 0.05, str(ROUNDS * 2 * K * 2 * FIRST))
    rep, _ = run_sequence(root, "base", ["cand"], plan, t.evaluate, t.gate)
    c = rep.candidates[0]
    passed = {m.metric for m in c.metrics if m.gated and m.verdict == "PASS"}
    bad_pass = c.verdict == "PASS" and (bool(c.integrity) or passed != DECLARED)
    return c.verdict, bad_pass


ROWS = [
    ("coding refused at every look (22% of its requests error), Δ 0", {"delta": 0.0, "error_rate": 0.22}),
    ("coding refused at every look (22% errors), Δ −tol", {"delta": -TOL, "error_rate": 0.22}),
    ("coding refused while its errors exceed the budget (6% of round 1's requests), Δ 0",
     {"delta": 0.0, "error_rate": 0.06, "error_items": FIRST}),
    ("coding refused while its errors exceed the budget (6% of round 1's requests), Δ −tol",
     {"delta": -TOL, "error_rate": 0.06, "error_items": FIRST}),
    ("coding source exhausted at 150 items, Δ 0", {"delta": 0.0, "available": {"coding": 150}}),
    ("coding source exhausted at 150 items, Δ −tol", {"delta": -TOL, "available": {"coding": 150}}),
    # exhausted at look 1, undecided, while longctx goes on to look 2: the pre-fix sequence dropped coding/pass@1
    ("coding source exhausted at 80 items (look 1), Δ 0", {"delta": 0.0, "available": {"coding": 80}}),
    ("coding source exhausted at 80 items (look 1), Δ −tol", {"delta": -TOL, "available": {"coding": 80}}),
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--rows", default="", help="comma-separated row numbers (1-based); default all")
    a = ap.parse_args(argv)
    rng = np.random.default_rng([a.seed, *(int(x) for x in a.rows.split(",") if x)])  # per row set: independent
    print(f"# budgeted gate, {ROUNDS} rounds of {FIRST} items, K {K}, tol {TOL}, error_budget {ERROR_BUDGET}; "
          f"{a.trials} independent trials per row")
    print("| row | P(PASS) | P(FAIL) | P(INCONCLUSIVE) | PASS with a suite undecided or refused | trials |")
    print("|---|---|---|---|---|---|")
    order = [int(x) for x in a.rows.split(",") if x] or list(range(1, len(ROWS) + 1))
    for i in order:
        label, row = ROWS[i - 1]
        counts, bad, t0 = {"PASS": 0, "FAIL": 0, "INCONCLUSIVE": 0}, 0, time.time()
        for t in range(1, a.trials + 1):
            with tempfile.TemporaryDirectory() as d:
                v, b = one(rng, Path(d), row)
            counts[v] += 1
            bad += b
            if t % 100 == 0:  # a partial tally on stderr: a long run can be read before it ends
                print(f"  row {i}: {t} trials {counts} bad {bad}", file=sys.stderr, flush=True)
        n = a.trials
        print(f"| {label} | {counts['PASS'] / n:.4f} | {counts['FAIL'] / n:.4f} | {counts['INCONCLUSIVE'] / n:.4f} | "
              f"{bad} | {n} |", flush=True)
        print(f"  ({time.time() - t0:.0f} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
