"""run_gate: load the runs, check they are comparable, measure every metric, decide, write gate.json.

The gate id is a content hash of everything the verdict depends on (build ids, suites,
alpha, noise_k, metric rules, and a fingerprint of every run's files),
with no timestamp: re-gating unchanged runs lands on the same gates/<id>/gate.json
(rewritten, `created` updated), and any change to the runs or the rules gets a new id.
"""

from __future__ import annotations

from pathlib import Path

from qverify.config import ALPHA, MetricRule, QVerifyConfig
from qverify.errors import ExitCode
from qverify.evals.store import atomic_write_text
from qverify.gate.assemble import suite_metrics
from qverify.gate.boundaries import LookLevels
from qverify.gate.decide import result
from qverify.gate.integrity import build_problems, pair_problems, run_problems
from qverify.gate.loader import RunData, has_run, load
from qverify.gate.metrics import check_rule_names
from qverify.gate.reference import SUITE as REF_SUITE
from qverify.gate.reference import MatchReference, match_reference
from qverify.gate.rule import ORDER, build_verdict, decide, refusals
from qverify.models import CandidateReport, GateReport, content_hash
from qverify.workdir import Workdir


def gate_candidate(build_id: str, recipe: str, base_runs: dict[str, RunData], cand_runs: dict[str, RunData],
                   rules: dict[str, MetricRule], alpha: float = ALPHA, noise_k: float | None = None,
                   refused: dict[str, list[str]] | None = None, look: LookLevels | None = None,
                   match_ref: MatchReference | None = None) -> CandidateReport:
    """Gate one candidate on the suites present on both sides (runs already checked comparable); at a look of
    the sequential gate, PASS at the look's nominal level and FAIL at its family-wise levels. greedy/match is
    compared with `match_ref` (qverify.gate.reference; None: the baseline). `refused`: suite -> why its runs
    were not gated (qverify.gate.integrity)."""
    evs = [e for suite, b in base_runs.items() if suite in cand_runs
           for e in suite_metrics(b, cand_runs[suite], rules, match_ref if suite == REF_SUITE else None)]
    if look is not None:
        alpha = look.pass_level
    decisions = decide(evs, alpha, noise_k, fail_level=look.fail_level if look else None,
                       family=look.family.get(build_id) if look else None)
    metrics = [result(d, alpha) for d in decisions]
    verdict, reasons = build_verdict(metrics, refused or {})
    perf = {f"{s}/{k}": v for s, r in cand_runs.items() if r.manifest for k, v in r.manifest.perf.items()}
    compared = {} if match_ref is None or match_ref.build_id in (None, _base_id(base_runs)) else \
        {m.metric: match_ref.build_id for m in metrics if m.details.get("reference") == match_ref.build_id}
    return CandidateReport(build_id=build_id, recipe=recipe, verdict=verdict, reasons=reasons, metrics=metrics,
                           perf=perf, integrity=refusals(refused or {}), seed_salts=seed_salts(base_runs, cand_runs),
                           compared_with=compared)


def _base_id(base_runs: dict[str, RunData]) -> str | None:
    return next((r.build_id for r in base_runs.values()), None)


def seed_salts(base_runs: dict[str, RunData], cand_runs: dict[str, RunData]) -> dict[str, list[int]]:
    """Each side's seed salts. Runs of differing salts are gated, not refused: the salt only decides
    whether replicate k shares its seed across the builds (common random numbers). The paired design
    does not rely on that coupling: d_i is a per-item difference of replicate means, its variance is
    estimated from the d_i themselves (design.py), and distances never use same-seed pairs anyway.
    Without the coupling the same estimator is still unbiased, only wider. So the report shows it
    instead (render.py), and the gate id changes with it (the salt is in every run manifest)."""

    def salts(runs: dict[str, RunData]) -> list[int]:
        return sorted({r.manifest.seed_salt for r in runs.values() if r.manifest is not None})

    return {"baseline": salts(base_runs), "candidate": salts(cand_runs)}


def shares_seeds(c: CandidateReport) -> bool:
    """Baseline and candidate sampled with one common salt (or salts unknown: an old report)."""
    b, k = c.seed_salts.get("baseline", []), c.seed_salts.get("candidate", [])
    return not b or not k or (len(b) == 1 and b == k)


def run_gate(workdir: Workdir | Path | str, baseline: str, candidates: list[str], suites: list[str] | None = None,
             config: QVerifyConfig | None = None, write: bool = True, look: LookLevels | None = None) -> GateReport:
    """Gate each candidate build against the baseline on `suites` (default: suites_to_gate's); `look`: one look
    of the sequential gate (qverify.gate.budget)."""
    wd = workdir if isinstance(workdir, Workdir) else Workdir.at(workdir)
    cfg = config or QVerifyConfig()
    check_rule_names(cfg.thresholds)
    suites = suites_to_gate(wd, baseline, suites, cfg)
    base_runs = {s: load(wd.runs, baseline, s) for s in suites}
    base_build = build_problems(wd, baseline, list(base_runs.values()))
    base_bad = {s: run_problems(r, cfg.error_budget) for s, r in base_runs.items()}
    reports, prints = [], {f"{baseline}/{s}": r.fingerprint for s, r in base_runs.items()}
    for cand in candidates:
        cand_runs = {s: load(wd.runs, cand, s) for s in suites}
        prints.update({f"{cand}/{s}": r.fingerprint for s, r in cand_runs.items()})
        build_bad = base_build + build_problems(wd, cand, list(cand_runs.values()))
        refused, ok = {}, []
        for s in suites:
            bad = base_bad[s] + run_problems(cand_runs[s], cfg.error_budget)
            bad += pair_problems(base_runs[s], cand_runs[s]) if not bad else []
            if bad or build_bad:  # results of unverified builds prove nothing either way
                refused[s] = build_bad + bad
            else:
                ok.append(s)
        ref = None
        if REF_SUITE in ok:  # greedy/match's reference, found by content (qverify.gate.reference)
            ref = match_reference(wd, baseline, cand, base_runs[REF_SUITE], cand_runs[REF_SUITE], cfg.error_budget)
            if ref.run is not None and ref.build_id != baseline:
                prints[f"{cand}/{REF_SUITE}@{ref.build_id}"] = ref.run.fingerprint
        reports.append(gate_candidate(cand, _recipe(wd, cand), {s: base_runs[s] for s in ok},
                                      {s: cand_runs[s] for s in ok}, cfg.thresholds,
                                      cfg.alpha_per_candidate(len(candidates)), cfg.noise_k, refused, look, ref))
    # rule v2.1: Hall's skewness correction estimated at the margin (qverify.gate.bounds.tilted_skewness)
    settings = {"alpha": cfg.alpha, "noise_k": cfg.noise_k, "rule": "v2.1", "error_budget": cfg.error_budget,
                "suites": suites, "thresholds": {k: v.model_dump() for k, v in sorted(cfg.thresholds.items())}}
    if len(candidates) > 1:  # no family of one: gate ids of single-candidate gates stay as they were
        settings["candidate_family"] = candidate_family(len(candidates), cfg)
    if look is not None:
        settings["look"] = {"look": look.look, "of": len(look.fractions), "pass_level": look.pass_level,
                            "gamma": look.gamma, "family": look.family}
    gate_id = content_hash({"baseline": baseline, "candidates": candidates, **settings, "runs": prints}, 12)
    verdict = max((c.verdict for c in reports), key=ORDER.__getitem__, default="INCONCLUSIVE")
    report = GateReport(gate_id=gate_id, baseline=baseline, baseline_recipe=_recipe(wd, baseline), verdict=verdict,
                        candidates=reports, config=settings)
    if write:
        write_report(wd, report)
    return report


def candidate_family(m: int, cfg: QVerifyConfig) -> dict:
    """m candidates gated against one baseline: each at its alpha, and what picking whichever PASSes risks."""
    each = cfg.alpha_per_candidate(m)
    if cfg.family_wise:
        note = (f"{m} candidates gated against one baseline, each at alpha {each:.4g} = {cfg.alpha:g}/{m} "
                f"(--family-wise, Bonferroni): a false PASS of any of them has chance <= {cfg.alpha:g}")
    else:
        note = (f"{m} candidates gated against one baseline, each at alpha {each:g}: picking whichever PASSes has "
                f"about {m}·alpha = {min(m * each, 1):.2g} chance of a false PASS (--family-wise tests each at "
                f"alpha/{m})")
    return {"candidates": m, "family_wise": cfg.family_wise, "alpha_per_candidate": each, "note": note}


def suites_to_gate(wd: Workdir, baseline: str, suites: list[str] | None, cfg: QVerifyConfig) -> list[str]:
    """The suites asked for by name, else those of config.suites the baseline was evaluated on (a candidate
    missing one of those is still refused), else all of config.suites (each then refused: no results)."""
    from qverify.suites import get_suite

    names = list(cfg.suites if suites is None else suites)
    for s in names:
        get_suite(s)  # an unknown suite name is a BadInput with did-you-mean
    if suites is None:
        names = [s for s in names if has_run(wd.runs, baseline, s)] or names
    return names


def write_report(wd: Workdir, report: GateReport) -> Path:
    path = wd.gate_report_path(report.gate_id)
    atomic_write_text(path, report.model_dump_json(indent=2))
    return path


def exit_code(report: GateReport) -> int:
    """0 PASS, 1 FAIL (any candidate), 3 the gate refused (runs not comparable), 2 INCONCLUSIVE."""
    if any(c.verdict == "FAIL" for c in report.candidates):
        return int(ExitCode.FAIL)
    if any(c.integrity for c in report.candidates):
        return int(ExitCode.INFRA)
    if report.verdict == "INCONCLUSIVE":
        return int(ExitCode.INCONCLUSIVE)
    return int(ExitCode.OK)


def _recipe(wd: Workdir, build_id: str) -> str:
    manifest = wd.build_manifest(build_id)
    return manifest.recipe if manifest is not None else build_id
