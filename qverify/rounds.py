"""The gate's one flow: plan -> (evaluate a round -> look)* -> write (qverify.gate.budget.run_sequence).

A budget buys rounds that each evaluate more items before a look at group-sequential levels; no budget is
the fixed gate, a plan of one look at all of alpha on the runs as they are. Orchestration, so it lives in the
pipeline layer beside pipeline.ensure_builds: qverify.gate stays statistics and the verdict, and imports no
runner, server or quantizer (tests/test_structure.py)."""

from __future__ import annotations

from dataclasses import dataclass

from qverify.config import QVerifyConfig
from qverify.errors import BadInput
from qverify.gate import ledger
from qverify.gate.boundaries import LookLevels, spending
from qverify.gate.budget import Look, Plan, make_plan, run_sequence
from qverify.models import GateReport
from qverify.workdir import Workdir


@dataclass(frozen=True)
class GateAsk:
    """What `qverify gate` was asked: builds by reference (`baseline` + `candidates`) or by recipe (`recipe`, else
    the config's candidates, built when missing), the suites, and a budget or `fixed`."""

    baseline: str | None = None
    candidates: tuple[str, ...] = ()
    recipe: str | None = None
    suites: list[str] | None = None
    budget: str | None = None
    fixed: bool = False


def gate(wd: Workdir, cfg: QVerifyConfig, ask: GateAsk, out, verbose: bool = False) -> GateReport:
    """`qverify gate`'s flow, one default however the builds are named: budgeted rounds (the ask's budget, the
    config's, else one sized from the tolerances) that resume whatever runs exist; `fixed` is one look at the
    runs as they are. Writes gate.json; prints only progress (the command prints the verdict)."""
    budget = ask.budget or cfg.budget  # the config's is validated when it is read, before any build
    if ask.fixed and budget:
        raise BadInput("--fixed and a budget are alternatives", fix="drop --fixed, or --budget / the config's budget")
    base_id, cand_ids, suites = _builds_to_gate(wd, cfg, ask, out, verbose)
    if not ask.fixed and budget is None:  # the default: the budgeted sequential gate (docs/gate.md)
        budget = str(default_budget(cfg, suites or list(cfg.suites), 1 + len(cand_ids)))
    with out.stdout_is_data():
        report, _, _ = gate_builds(wd, cfg, base_id, cand_ids, suites, None if ask.fixed else budget,
                                   show_progress=not out.json_mode, evaluate_fixed=ask.fixed and not ask.baseline,
                                   warn=out.warn)
    return report


def decided_nothing(report: GateReport) -> bool:
    """Every candidate refused (runs missing or not comparable) and no metric PASSed or FAILed: no release evidence."""
    return all(c.integrity and not any(m.verdict in ("PASS", "FAIL") for m in c.metrics) for c in report.candidates)


def upload_gate(wd: Workdir, report: GateReport, tracking_uri: str | None, out) -> int:
    """The release review to MLflow after a gate: 0, or 3 when tracking failed (the verdict stands, a replay command is
    printed). A gate that decided nothing is no release candidate, so it is not uploaded (exit 3 already says so)."""
    from qverify.output import Output, PipeConsole
    from qverify.reports.publish import report_after_gate

    if decided_nothing(report):
        out.warn(f"gate {report.gate_id} decided nothing, so it is not uploaded as a release candidate")
        return 0
    # the report step talks on stderr only, so `--json` stdout stays one document (the GateReport)
    quiet = Output(json_mode=False, console=PipeConsole(stderr=True))
    with out.stdout_is_data():  # MLflow's own prints too
        return report_after_gate(wd, report.gate_id, tracking_uri, out=quiet)


def _builds_to_gate(wd: Workdir, cfg: QVerifyConfig, ask: GateAsk, out, verbose: bool
                    ) -> tuple[str, list[str], list[str] | None]:
    """(baseline id, candidate ids, suites): named builds resolved, recipes built when missing. The suites are the
    ones asked for, else the config's plus `greedy` when a candidate changes the drafter; a fixed look at named
    builds keeps None (the suites the baseline ran, qverify.gate.gate.suites_to_gate)."""
    from qverify.pipeline import suites_for_builds

    if ask.baseline and ask.candidates:
        if ask.recipe:
            raise BadInput("--recipe and --baseline/--candidate are alternatives", fix="pass one or the other")
        base_id = wd.resolve_build_id(ask.baseline)
        cand_ids = [wd.resolve_build_id(c) for c in ask.candidates]
        suites = ask.suites if ask.fixed else ask.suites or suites_for_builds(wd, list(cfg.suites), cand_ids)
        return base_id, cand_ids, suites
    if ask.baseline or ask.candidates:
        raise BadInput("--baseline and --candidate go together", fix="pass both, or --recipe NAME, or neither (./qverify.toml)")
    from qverify.logs import quiet_heavy_libraries
    from qverify.pipeline import ensure_builds, suites_for_recipes

    quiet_heavy_libraries(verbose)
    cands = [ask.recipe] if ask.recipe else list(cfg.candidates)
    suites = ask.suites or suites_for_recipes(list(cfg.suites), cands)
    with out.stdout_is_data():
        base_id, cand_ids = ensure_builds(wd, cfg, baseline=cfg.baseline, candidates=cands, out=out)
    return base_id, cand_ids, suites


def gate_builds(wd: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], suites: list[str] | None,
                budget: str | None, show_progress: bool = True, evaluate_fixed: bool = False,
                warn=None) -> tuple[GateReport, list[Look], Plan]:
    """Gate the candidates against the baseline within `budget` (None: one fixed look); writes gate.json.
    `evaluate_fixed`: the fixed look first evaluates what is missing to the config's limit (`gate --recipe --fixed`);
    otherwise a fixed look gates the runs as they are."""
    from qverify.evals.store import RunStore
    from qverify.gate.gate import run_gate, suites_to_gate, write_report

    if budget is None:  # the runs as they are: by default the configured suites the baseline was evaluated on
        suites = suites_to_gate(wd, baseline, suites, cfg)
        plan = Plan.fixed(suites, cfg.replicates, cfg.alpha_per_candidate(len(candidates)))
        evaluate, twins = (_evaluator(wd, cfg, baseline, candidates, suites, show_progress, warn)
                           if evaluate_fixed else (None, []))
    else:  # evaluated round by round: every suite asked for
        suites = suites_to_gate(wd, baseline, suites or list(cfg.suites), cfg)
        evaluate, twins = _evaluator(wd, cfg, baseline, candidates, suites, show_progress, warn)
        plan = make_plan(suites, _first_look(cfg, suites), cfg.replicates, 1 + len(candidates),
                         cfg.alpha_per_candidate(len(candidates)),  # the looks' levels spend each candidate's alpha
                         budget, cfg.looks, extra_builds={"greedy": len(twins)} if twins else None,
                         seed_salt=cfg.seed_salt)

    def items_now(builds: list[str], want: dict[str, int], reps: dict[str, int] | None = None) -> list[dict[str, int]]:
        if evaluate is not None:
            evaluate(builds + twins, want, reps or {})
            if plan.is_fixed:  # the look sees the runs as evaluated now: their ledger decides its alpha again
                plan.alpha = ledger.remaining(wd.runs, baseline, candidates, plan.suites, instance, full_alpha)
        ms = [{s: RunStore(wd.run_dir(b, s)).read_manifest() for s in want} for b in builds]
        return [{s: m.n_items if m is not None else 0 for s, m in got.items()} for got in ms]

    def gate(open_suites: list[str], look: LookLevels) -> GateReport:
        return run_gate(wd, baseline, candidates, open_suites, cfg, write=False, look=look)

    instance, full_alpha = _instance(wd, baseline, candidates, plan), plan.alpha
    plan.alpha = ledger.remaining(wd.runs, baseline, candidates, plan.suites, instance, full_alpha)
    report, looks = run_sequence(wd.gates, baseline, candidates, plan, items_now, gate)
    spent = plan.alpha if plan.is_fixed else float(spending(len(looks) / plan.looks, plan.alpha, plan.gamma))
    ledger.record(wd.runs, baseline, candidates, plan.suites, instance, spent, "fixed" if plan.is_fixed else "budgeted",
                  report.gate_id, len(looks), dict(looks[-1].items) if looks else {})
    write_report(wd, report)
    return report, looks, plan


def _instance(wd: Workdir, baseline: str, candidates: list[str], plan: Plan):
    """Which gate this is in the runs' ledger (qverify.gate.ledger), per (candidate, suite): a fixed gate is the
    suite's runs' content (re-gating unchanged runs is the same gate); a budgeted one its sequence, resumed while
    gates/ holds its looks, else new."""
    import json

    from qverify.gate.budget import sequence_id
    from qverify.gate.loader import fingerprint
    from qverify.models import content_hash
    from qverify.workdir import sequence_path

    if plan.is_fixed:  # read when asked: a fixed look that evaluates first (`--recipe --fixed`) records its runs as
        # they are after the evaluation, which a rerun on the same runs then finds
        return lambda c, s: "fixed-" + content_hash({"baseline": baseline, "suite": s, "runs": [
            fingerprint(wd.runs, baseline, s), fingerprint(wd.runs, c, s)]}, 12)
    seq = sequence_id(baseline, candidates, plan)
    seen = list(dict.fromkeys(e["instance"] for c in candidates for s in plan.suites
                              for e in ledger.entries(wd.runs, baseline, c, s) if e["instance"].startswith(seq + "/")))
    state = sequence_path(wd.gates, seq)
    resumed = state.exists() and json.loads(state.read_text() or "{}")
    return seen[-1] if resumed and seen else f"{seq}/{len(seen)}"


def _evaluator(wd: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], suites: list[str],
               show_progress: bool, warn):
    """The one way the gate evaluates: each round brings the builds (and greedy/match's twins, on greedy) to their
    items, with the serving profile `qverify eval` resolves. A fixed look evaluates once, to the config's limit."""
    from qverify.pipeline import ensure_twins, evaluate_builds, serving_profile

    # greedy/match's references (the candidates' twins) are evaluated on greedy alongside the candidates
    twins = ensure_twins(wd, baseline, candidates, trust_remote_code=cfg.trust_remote_code) if "greedy" in suites else []
    serving = serving_profile(cfg.serving)

    def evaluate(builds: list[str], want: dict[str, int], reps: dict[str, int]) -> None:
        for spec in round_specs(cfg, want, reps, serving):
            evaluate_builds(wd, builds, spec, show_progress=show_progress, warn=warn,
                            suites_by_build={t: ["greedy"] for t in twins})

    return evaluate, twins


def round_specs(cfg: QVerifyConfig, want: dict[str, int], reps: dict[str, int], serving) -> list:
    """One EvalSpec per distinct (items, replicates) a round asks for, so one server session per build and group: a
    suite whose finite source ran out grows its replicates instead of its items (qverify.gate.budget)."""
    from qverify.pipeline import EvalSpec

    specs = []
    for n, r in sorted({(m, reps.get(s)) for s, m in want.items()}, key=lambda x: (x[0], x[1] or 0)):
        group = [s for s, m in want.items() if m == n and reps.get(s) == r]
        # 0: a fixed plan's look (Plan.fixed), evaluated to the config's limit as `qverify eval` does
        specs.append(EvalSpec.from_config(cfg, suites=group, serving=serving) if n == 0 else
                     EvalSpec.from_config(cfg, suites=group, limit=n, grow=True, serving=serving, replicates=r))
    return specs


def default_budget(cfg: QVerifyConfig, suites: list[str], n_builds: int) -> int:
    """`qverify gate`'s request budget when none is given, sized from the tolerances (qverify.gate.plan_size)."""
    from qverify.gate.plan_size import default_budget as sized

    return sized(suites, _first_look(cfg, suites), cfg.replicates, n_builds, cfg.alpha_per_candidate(n_builds - 1),
                 cfg.thresholds)


def _first_look(cfg: QVerifyConfig, suites: list[str]) -> dict[str, int]:
    """Items per suite at look 1, and added each round: the config's limit, else the suite's default."""
    from qverify.suites import get_suite

    return {s: cfg.limit or get_suite(s).default_n for s in suites}
