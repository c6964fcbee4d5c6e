"""The gate's terminal table: one per candidate, every metric, its numbers and the one-sentence why."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from qverify.models import CandidateReport, GateReport, MetricResult

STYLE = {"PASS": "green", "FAIL": "bold red", "INCONCLUSIVE": "yellow"}


def _num(x: float) -> str:
    return f"{x:.3f}" if abs(x) < 100 else f"{x:.4g}"


def _spread(vals: list[float]) -> str:
    return f" ({_num(min(vals))}–{_num(max(vals))})" if len(vals) > 1 else ""


def _flips(m: MetricResult) -> str:
    if not m.flips:
        return ""
    base = f" vs {m.flips['baseline_rate']:.1%}" if "baseline_rate" in m.flips else ""
    return f"-{m.flips['regressed']:.0f}/+{m.flips['improved']:.0f}{base}"


def _row(m: MetricResult) -> list[str]:
    verdict = f"[{STYLE[m.verdict]}]{m.verdict}[/]" if m.gated else f"[dim]{m.verdict.lower()} (info)[/]"
    p = "" if m.p_value is None else f"{m.p_value:.2g}" + ("" if m.p_adjusted is None else f" ({m.p_adjusted:.2g})")
    why = m.reason + (f" → {m.advice}" if m.advice else "")
    return [m.metric, _num(m.baseline_mean) + _spread(m.baseline_spread), _num(m.candidate_mean) + _spread(m.candidate_spread),
            f"{m.delta:+.3f} [{m.ci_low:+.3f}, {m.ci_high:+.3f}]", _num(m.noise_band), _num(m.tolerance),
            _num(m.mde), p, _flips(m), verdict, why]


def candidate_table(c: CandidateReport, baseline: str) -> Table:
    t = Table(title=f"{c.recipe} ({c.build_id}) vs {baseline}: [{STYLE[c.verdict]}]{c.verdict}[/]", show_lines=False)
    for col in ("metric", "baseline", "candidate", "Δ [one-sided bounds]", "run SD", "tol", "MDE", "p FAIL (Holm)", "flips",
                "verdict", "why"):
        t.add_column(col, overflow="fold", max_width=60 if col == "why" else None)
    for m in sorted(c.metrics, key=lambda m: (not m.gated, m.metric)):
        t.add_row(*_row(m))
    return t


def render(report: GateReport, console: Console) -> None:
    for c in report.candidates:
        console.print(candidate_table(c, report.baseline_recipe))
        for r in c.integrity:
            console.print(f"[red]refused:[/] {r}", highlight=False)
        if c.verdict != "PASS":
            for r in c.reasons[:8]:
                console.print(f"  • {r}", highlight=False, markup=False)
    console.print(f"gate {report.gate_id}: [{STYLE[report.verdict]}]{report.verdict}[/]")


def render_looks(report: GateReport, console: Console) -> None:
    """The sequential gate: each look's level, items and requests, and each metric's bounds at that look."""
    seq = report.config.get("sequential") or {}
    looks = seq.get("looks", [])
    if not looks:
        return
    t = Table(title=f"sequential gate {seq.get('id')}: {len(looks)} of {seq['plan']['looks']} planned looks")
    for col in ("look", "level", "items", "requests", "time", "metric bounds [Δ low, high] → verdict"):
        t.add_column(col, overflow="fold", max_width=90 if col.startswith("metric") else None)
    for lk in looks:
        cells = []
        for cand, ms in lk["metrics"].items():
            for name, m in sorted(ms.items()):
                cells.append(f"{cand}:{name} [{m['lo']:+.3f}, {m['hi']:+.3f}] → {m['verdict']}")
        items = ", ".join(f"{s} {n}" for s, n in lk["items"].items()) or "-"
        t.add_row(str(lk["look"]), f"{lk['level']:.4f}", items, str(lk["requests"]), f"{lk['seconds']:.0f}s",
                  "\n".join(cells) or "(nothing left undecided)")
    console.print(t)
    last = looks[-1]
    console.print(f"the budget bought {last['requests']} requests in {last['seconds']:.0f}s"
                  + (f"; finite sources exhausted: {', '.join(last['exhausted'])}" if last.get("exhausted") else ""))
