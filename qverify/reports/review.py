"""The release review's content, computed once and rendered twice (report.md and report.html)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from qverify.models import CandidateReport, MetricResult
from qverify.reports.bundle import GateBundle
from qverify.reports.facts import BuildFacts, build_facts, recipe_changes
from qverify.reports.flips import Flip, flipped

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


def is_rate(m: MetricResult) -> bool:
    """Accuracy-like metrics read as percentages; distances (kld) stay raw."""
    return "kld" not in m.metric and all(0.0 <= v <= 1.0 for v in (m.baseline_mean, m.candidate_mean))


def fmt_value(m: MetricResult, v: float | None) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f}%" if is_rate(m) else f"{v:.4g}"


def fmt_delta(m: MetricResult, v: float, signed: bool = True, unit: bool = True) -> str:
    s = f"{100 * v:+.1f}" if is_rate(m) else f"{v:+.3g}" if unit else f"{v:+.2g}"
    s = s if signed else s.lstrip("+")
    return s.replace("-", "−") + (" pts" if is_rate(m) and unit else "")


def fmt_spread(m: MetricResult, spread: list[float]) -> str:
    if len(spread) < 2:
        return ""
    lo, hi = min(spread), max(spread)
    return f"{100 * lo:.1f}–{100 * hi:.1f}" if is_rate(m) else f"{lo:.3g}–{hi:.3g}"


def fmt_p(m: MetricResult) -> str:
    if m.p_value is None:
        return "–"
    f = lambda p: f"{p:.2g}" if p >= 0.001 else "<0.001"
    return f(m.p_value) + (f" / {f(m.p_adjusted)}" if m.p_adjusted is not None else "")


_FLIP_SYMBOL = {"regressed": "↓", "improved": "↑"}


def fmt_flips(m: MetricResult) -> str:
    """regressed/improved as ↓n ↑n, then the flip rate against the baseline's own replicate-to-replicate rate."""
    f = m.flips
    parts = [f"{sym}{f[k]:g}" for k, sym in _FLIP_SYMBOL.items() if k in f]
    if "rate" in f:
        parts.append(f"({f['rate']:.0%}" + (f" vs {f['baseline_rate']:.0%} base)" if "baseline_rate" in f else ")"))
    parts += [f"{k}={v:.3g}" for k, v in f.items() if k not in (*_FLIP_SYMBOL, "rate", "baseline_rate")]
    return " ".join(parts) or "–"


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
