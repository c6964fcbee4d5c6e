"""The gate's one flow: plan -> (evaluate a round -> look)* -> write (qverify.gate.budget.run_sequence).

A budget buys rounds that each evaluate more items before a look at group-sequential levels; no budget is
the fixed gate, a plan of one look at all of alpha on the runs as they are. Orchestration, so it lives in the
pipeline layer beside pipeline.ensure_runs: qverify.gate stays statistics and the verdict, and imports no
runner, server or quantizer (tests/test_structure.py)."""

from __future__ import annotations

from qverify.config import QVerifyConfig
from qverify.errors import BadInput
from qverify.gate.boundaries import LookLevels
from qverify.gate.budget import Look, Plan, make_plan, run_sequence
from qverify.models import GateReport
from qverify.workdir import Workdir


def gate_builds(wd: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], suites: list[str] | None,
                budget: str | None, show_progress: bool = True) -> tuple[GateReport, list[Look], Plan]:
    """Gate the candidates against the baseline within `budget` (None: one fixed look); writes gate.json."""
    from qverify.evals.store import RunStore
    from qverify.gate.gate import run_gate, suites_to_gate, write_report

    if budget is None:  # the runs as they are: by default the configured suites the baseline was evaluated on
        suites = suites_to_gate(wd, baseline, suites, cfg)
        plan = Plan.fixed(suites, cfg.replicates, cfg.alpha_per_candidate(len(candidates)))
        evaluate, twins = None, []
    else:  # evaluated round by round: every suite asked for
        suites = suites_to_gate(wd, baseline, suites or list(cfg.suites), cfg)
        plan, evaluate, twins = _rounds(wd, cfg, baseline, candidates, suites, budget, show_progress)

    def items_now(builds: list[str], want: dict[str, int]) -> list[dict[str, int]]:
        if evaluate is not None:
            evaluate(builds + twins, want)
        ms = [{s: RunStore(wd.run_dir(b, s)).read_manifest() for s in want} for b in builds]
        return [{s: m.n_items if m is not None else 0 for s, m in got.items()} for got in ms]

    def gate(open_suites: list[str], look: LookLevels) -> GateReport:
        return run_gate(wd, baseline, candidates, open_suites, cfg, write=False, look=look)

    report, looks = run_sequence(wd.gates, baseline, candidates, plan, items_now, gate)
    if plan.is_fixed:
        from qverify.gate.looks import earlier_looks

        again = earlier_looks(wd, report)
        if again:
            raise BadInput(f"a second look at full alpha is optional stopping: {again[0]}",
                           fix="gate grown runs with the budgeted gate (`qverify gate --budget REQUESTS`), whose looks "
                               "have sequential levels")
    write_report(wd, report)
    return report, looks, plan


def _rounds(wd: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], suites: list[str], budget: str,
            show_progress: bool):
    """The budget's plan, and each round's evaluation of the builds (and greedy/match's twins) to their items."""
    from qverify.pipeline import EvalSpec, ensure_twins, evaluate_builds, serving_profile

    # greedy/match's references (the candidates' twins) grow with the candidates' greedy runs, round by round
    twins = ensure_twins(wd, baseline, candidates, trust_remote_code=cfg.trust_remote_code) if "greedy" in suites else []
    alpha = cfg.alpha_per_candidate(len(candidates))  # the looks' levels spend each candidate's alpha
    plan = make_plan(suites, _first_look(cfg, suites), cfg.replicates, 1 + len(candidates), alpha, budget, cfg.looks,
                     extra_builds={"greedy": len(twins)} if twins else None, seed_salt=cfg.seed_salt)
    serving = serving_profile(cfg.serving)  # as `qverify eval` resolves it

    def evaluate(builds: list[str], want: dict[str, int]) -> None:
        for n in sorted(set(want.values())):  # one server session per build and distinct item count
            group = [s for s, m in want.items() if m == n]
            spec = EvalSpec.from_config(cfg, suites=group, limit=n, grow=True, serving=serving)
            evaluate_builds(wd, builds, spec, show_progress=show_progress,
                            suites_by_build={t: ["greedy"] for t in twins})

    return plan, evaluate, twins


def default_budget(cfg: QVerifyConfig, suites: list[str], n_builds: int) -> int:
    """`qverify gate`'s request budget when none is given, sized from the tolerances (qverify.gate.plan_size)."""
    from qverify.gate.plan_size import default_budget as sized

    tols = {k: v.tolerance for k, v in cfg.thresholds.items()}
    return sized(suites, _first_look(cfg, suites), cfg.replicates, n_builds, cfg.alpha_per_candidate(n_builds - 1), tols)


def _first_look(cfg: QVerifyConfig, suites: list[str]) -> dict[str, int]:
    """Items per suite at look 1, and added each round: the config's limit, else the suite's default."""
    from qverify.suites import get_suite

    return {s: cfg.limit or get_suite(s).default_n for s in suites}
