"""Whole budgeted gates at the default plan, through the code path `qverify gate` runs: one trial is one
qverify.gate.budget.run_sequence over a fresh gates folder, planned by qverify.gate.plan_size (the request
budget of the embedded default's suites) and make_plan, whose gate callback decides each look with the
functions run_gate's gate_candidate calls (rule.decide at the look's LookLevels, decide.result,
rule.build_verdict). Only the runs are simulated: each suite's per-item paired differences come from
gate_oc.py's item models (GATE_SUITES), drawn once per trial for the most items the plan can reach, so look
j sees the first j * n1 of them, as the runner's growing runs do.

BYSTANDERS more gated metrics that PASS at the first look stand for the embedded default's other gated
metrics: run_sequence's FAIL family is every gated metric at look 1 (15 on the embedded default), and a
family of 4 would overstate FAIL power.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from oc_models import ALPHA, GATE_SUITES, TOL, Point, paired_d

from qverify.gate.boundaries import LookLevels
from qverify.gate.budget import make_plan, run_sequence
from qverify.gate.decide import result
from qverify.gate.plan_size import plan_rounds
from qverify.gate.rule import Evidence, build_verdict, decide
from qverify.models import CandidateReport, GateReport

EMBEDDED = ["coding", "toolcall", "longctx", "verifier", "kld"]  # QVerifyConfig().suites: the no-config gate's
FIRST = 60  # items per round of each simulated suite (the embedded suites' default_n, kld's 150 aside)
BYSTANDERS = 11  # 4 simulated + 11 = the 15 gated metrics of the embedded default's report


def default_rounds() -> int:
    """J of the plan `qverify gate --recipe R` makes with no qverify.toml (commands/gate.py: _default_budget)."""
    from qverify.suites import get_suite

    return plan_rounds(EMBEDDED, {s: get_suite(s).default_n for s in EMBEDDED}, ALPHA)


def look_report(evs: list[Evidence], look: LookLevels) -> GateReport:
    """One simulated candidate's GateReport at a look, decided by the rule the CLI runs (decide, build_verdict);
    look 1 adds the bystander suites, so the FAIL family is the default plan's."""
    evs = evs + (_bystanders() if look.look == 1 else [])
    ds = decide(evs, look.pass_level, None, fail_level=look.fail_level, family=look.family.get("cand"))
    metrics = [result(x, look.pass_level) for x in ds]
    verdict, reasons = build_verdict(metrics, {})
    cand = CandidateReport(build_id="cand", recipe="sim", verdict=verdict, reasons=reasons, metrics=metrics)
    return GateReport(gate_id=f"look{look.look}", baseline="base", verdict=verdict, candidates=[cand])


def _bystanders() -> list[Evidence]:
    """Clearly better everywhere (d = +0.4 or +0.6, not bounded: the cheap t bound PASSes them at once)."""
    return [Evidence(f"other/m{i}", "higher", TOL, 0.5 + 0.1 * (-1.0) ** np.arange(FIRST)) for i in range(BYSTANDERS)]


def one_gate(state: dict[str, float], rounds: int, rng: np.random.Generator, root: Path) -> tuple[str, int]:
    """(verdict, requests) of one budgeted gate of one candidate at true state {suite: Delta in tolerances}."""
    suites = list(GATE_SUITES)
    data = {}
    for name, pt in GATE_SUITES.items():
        d, bounded = paired_d(Point(state.get(name, 0.0) * TOL, 0, pt.k, pt.coupling, pt.damage, pt.model), 1, rng,
                              FIRST * rounds)
        data[name] = (d[0], bounded)
    first = {s: FIRST for s in suites}
    budget = rounds * sum(first.values()) * 3 * 2  # J full rounds, as plan_size.default_budget
    plan = make_plan(suites, first, 3, 2, ALPHA, str(budget))
    have: dict[str, int] = {}

    def evaluate(builds: list[str], want: dict[str, int]) -> list[dict[str, int]]:
        have.update(want)
        return [dict(want) for _ in builds]

    def gate(open_suites: list[str], look: LookLevels) -> GateReport:
        evs = [Evidence(f"{s}/m", "higher", TOL, data[s][0][:have[s]], bounded=data[s][1]) for s in open_suites]
        return look_report(evs, look)

    report, looks = run_sequence(root, "base", ["cand"], plan, evaluate, gate)
    return report.verdict, looks[-1].requests


def whole_gates(state: dict[str, float], trials: int, rng: np.random.Generator, rounds: int) -> dict[str, float]:
    verdicts, requests = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for t in range(trials):
            v, r = one_gate(state, rounds, rng, Path(tmp) / str(t))
            verdicts.append(v)
            requests.append(r)
    v = np.asarray(verdicts)
    return {"PASS": float(np.mean(v == "PASS")), "FAIL": float(np.mean(v == "FAIL")),
            "median_requests": float(np.median(requests))}
