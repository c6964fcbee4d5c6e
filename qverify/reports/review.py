"""The release review's content, computed once and rendered twice (report.md and report.html)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from qverify.models import CandidateReport
from qverify.reports.bundle import GateBundle
from qverify.reports.facts import BuildFacts, build_facts, recipe_changes
from qverify.reports.flips import Flip, flipped
from qverify.reports.formatting import fmt_delta

VERDICT_WORD = {"PASS": "passes", "FAIL": "fails", "INCONCLUSIVE": "is inconclusive"}


@dataclass
class Review:
    bundle: GateBundle
    headline: str
    facts: list[BuildFacts]
    changes: dict[str, list[str]]
    flips: dict[str, list[Flip]]
    flip_counts: dict[str, dict[str, int]]
    commands: list[str]
    plots: dict[str, Path] = field(default_factory=dict)


def _candidate_clause(c: CandidateReport) -> str:
    gated = [m for m in c.metrics if m.gated]
    if c.verdict == "PASS":
        return f"{c.recipe} passes: all {len(gated)} gated metrics are shown within their tolerances"
    bad = [m for m in gated if m.verdict == c.verdict] or gated
    if not bad:
        return f"{c.recipe} {VERDICT_WORD[c.verdict]} ({'; '.join(c.reasons) or 'no gated metric'})"
    worst = min(bad, key=lambda m: (m.delta if m.direction == "higher" else -m.delta))
    what = (f"{worst.metric} Δ {fmt_delta(worst, worst.delta)}, bounds [{fmt_delta(worst, worst.ci_low)}, "
            f"{fmt_delta(worst, worst.ci_high)}], tolerance {fmt_delta(worst, worst.tolerance, signed=False)}")
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"{c.recipe} {VERDICT_WORD[c.verdict]} on {what}{more}"


def headline(bundle: GateBundle) -> str:
    """The verdict in one sentence, first thing a reviewer reads."""
    g = bundle.gate
    clauses = "; ".join(_candidate_clause(c) for c in g.candidates) or "no candidates"
    return f"{g.verdict}: against the {g.baseline_recipe} baseline, {clauses}."


def reproduce_commands(bundle: GateBundle) -> list[str]:
    """The exact commands that rebuild, re-run and re-gate this review."""
    g = bundle.gate
    root = ["qverify"]
    if bundle.workdir != Path(".qverify").resolve():
        root += ["--workdir", str(bundle.workdir)]
    q = lambda *a: shlex.join(root + [str(x) for x in a])
    cmds = []
    for b in bundle.build_ids:
        m = bundle.builds.get(b)
        args = ["build", "--recipe", bundle.recipe(b)]
        if m and m.source_model and "qverify/assets" not in m.source_model:
            args += ["--model", m.source_model]
        if m and m.drafter and "qverify/assets" not in m.drafter:
            args += ["--drafter", m.drafter]
        cmds.append(q(*args) + f"   # expect build id {b}")
    for b in bundle.build_ids:
        runs = [r for (bb, _), r in bundle.runs.items() if bb == b]
        suites = ",".join(r.suite for r in runs) or ",".join(bundle.suites)
        reps = max((r.manifest.replicates for r in runs if r.manifest), default=None)
        cmds.append(q("eval", b, "--suites", suites, *(["--replicates", reps] if reps else [])))
    gate_cmd = g.config.get("command")
    if isinstance(gate_cmd, list):
        gate_cmd = shlex.join(gate_cmd)
    cmds.append(gate_cmd or q("gate", "--baseline", g.baseline, *[x for c in g.candidates for x in ("--candidate", c.build_id)]))
    cmds.append(q("report", "--gate", g.gate_id))
    return cmds


def build_review(bundle: GateBundle, flips_per_candidate: int = 4) -> Review:
    base = bundle.builds.get(bundle.gate.baseline)
    every = {c.build_id: flipped(bundle, c.build_id, limit=10**9) for c in bundle.gate.candidates}
    return Review(
        bundle=bundle,
        headline=headline(bundle),
        facts=build_facts(bundle),
        changes={c.build_id: recipe_changes(base, bundle.builds.get(c.build_id)) for c in bundle.gate.candidates},
        flips={b: fl[:flips_per_candidate] for b, fl in every.items()},
        flip_counts={b: {d: sum(f.direction == d for f in fl) for d in ("regressed", "improved")} for b, fl in every.items()},
        commands=reproduce_commands(bundle),
    )
