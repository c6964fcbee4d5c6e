"""The budgeted gate wired to the real runner: each round evaluates more items, then gates (qverify.gate.budget).

Orchestration, so it lives in the pipeline layer beside pipeline.ensure_runs: qverify.gate stays statistics
and the verdict, and imports no runner, server or quantizer (tests/test_structure.py)."""

from __future__ import annotations

from qverify.config import QVerifyConfig
from qverify.gate.boundaries import LookLevels
from qverify.gate.budget import Look, Plan, make_plan, run_sequence
from qverify.models import GateReport
from qverify.workdir import Workdir


def gate_in_rounds(wd: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], suites: list[str],
                   budget: str, show_progress: bool = True) -> tuple[GateReport, list[Look], Plan]:
    from qverify.evals.store import RunStore
    from qverify.gate.gate import run_gate, write_report
    from qverify.pipeline import EvalSpec, ensure_twins, evaluate_builds, serving_profile
    from qverify.suites import get_suite

    # greedy/match's references (the candidates' twins) grow with the candidates' greedy runs, round by round
    twins = ensure_twins(wd, baseline, candidates, trust_remote_code=cfg.trust_remote_code) if "greedy" in suites else []
    first = {s: cfg.limit or get_suite(s).default_n for s in suites}
    alpha = cfg.alpha_per_candidate(len(candidates))  # the looks' levels spend each candidate's alpha
    plan = make_plan(suites, first, cfg.replicates, 1 + len(candidates), alpha, budget, cfg.looks,
                     extra_builds={"greedy": len(twins)} if twins else None, seed_salt=cfg.seed_salt)
    serving = serving_profile(cfg.serving)  # as `qverify eval` resolves it

    def evaluate(builds: list[str], want: dict[str, int]) -> list[dict[str, int]]:
        for n in sorted(set(want.values())):  # one server session per build and distinct item count
            group = [s for s, m in want.items() if m == n]
            spec = EvalSpec.from_config(cfg, suites=group, limit=n, grow=True, serving=serving)
            evaluate_builds(wd, builds + twins, spec, show_progress=show_progress,
                            suites_by_build={t: ["greedy"] for t in twins})
        got = []
        for build in builds:
            ms = {s: RunStore(wd.run_dir(build, s)).read_manifest() for s in want}
            got.append({s: m.n_items if m is not None else 0 for s, m in ms.items()})
        return got

    def gate(open_suites: list[str], look: LookLevels) -> GateReport:
        return run_gate(wd, baseline, candidates, open_suites, cfg, write=False, look=look)

    report, looks = run_sequence(wd.gates, baseline, candidates, plan, evaluate, gate)
    write_report(wd, report)
    return report, looks, plan
