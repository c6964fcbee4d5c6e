"""The gate's output: on a wide terminal a table per candidate (every metric, its numbers and the
one-sentence why); piped, in CI or in a narrow terminal a compact summary, one line per gated metric
(delta, CI, tolerance, verdict) within 100 columns. gate.json and the report hold everything either way.
"""

from __future__ import annotations

import textwrap

from rich import box
from rich.console import Console
from rich.table import Table

from qverify.gate.gate import shares_seeds
from qverify.gate.looks import budgeted
from qverify.models import CandidateReport, GateReport, MetricResult
from qverify.output import PLAIN_WIDTH  # README's one width promise for piped output

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
            f"{m.delta:+.3f} [{m.ci_low:+.3f}, {m.ci_high:+.3f}]", _num(m.noise_band), f"{m.tolerance:.4g}",
            _num(m.mde), p, _flips(m), str(m.n_items), verdict, why]


def candidate_table(c: CandidateReport, baseline: str) -> Table:
    t = Table(title=f"{c.recipe} ({c.build_id}) vs {baseline}: [{STYLE[c.verdict]}]{c.verdict}[/]", show_lines=False)
    # items: how many paired items the metric was decided on (a KL over a silent subset shows here)
    for col in ("metric", "baseline", "candidate", "Δ [one-sided bounds]", "run SD", "tol", "MDE", "p FAIL (Holm)", "flips",
                "items", "verdict", "why"):
        t.add_column(col, overflow="fold", max_width=60 if col == "why" else None)
    for m in sorted(c.metrics, key=lambda m: (not m.gated, m.metric)):
        t.add_row(*_row(m))
    return t


def seed_note(c: CandidateReport) -> str | None:
    """A line when the two sides were sampled with different seed salts (gated all the same: gate.seed_salts)."""
    if shares_seeds(c):
        return None
    return (f"seed salts differ (baseline {c.seed_salts['baseline']}, candidate {c.seed_salts['candidate']}): no "
            "shared seeds between the builds; the paired bounds hold but are wider than with one salt")


def metric_warnings(c: CandidateReport) -> list[str]:
    """Caveats a verdict stands with (details.warning, e.g. a baseline self-KL that is a sizeable share of the
    tolerance): shown whatever the verdict, since a PASS's reasons are not printed."""
    return [f"{m.metric}: {m.details['warning']}" for m in c.metrics if m.gated and m.details.get("warning")]


def reference_notes(c: CandidateReport) -> list[str]:
    """Metrics compared with a build other than the baseline (greedy/match with the candidate's twin)."""
    return [f"{metric} compared with {ref} (the candidate's target with the baseline's drafter)"
            for metric, ref in sorted(c.compared_with.items())]


TABLE_MIN_WIDTH = 120  # the table's 11 columns fold into unreadable slivers below this


def family_note(report: GateReport) -> str | None:
    """Several candidates against one baseline: the family and its false-PASS chance (gate.candidate_family)."""
    return (report.config.get("candidate_family") or {}).get("note")


def render(report: GateReport, console: Console) -> None:
    if console.is_terminal and console.width >= TABLE_MIN_WIDTH:
        render_table(report, console)
    else:
        render_compact(report, console, width=min(PLAIN_WIDTH, console.width) if console.is_terminal else PLAIN_WIDTH)


def _metric_figures(m: MetricResult) -> str:
    band = f"run SD {_num(m.noise_band)}"
    return f"Δ {m.delta:+.3f} [{m.ci_low:+.3f}, {m.ci_high:+.3f}]  {band:<12} tol {m.tolerance:.4g}"


def _metric_lines(m: MetricResult, name_w: int, width: int) -> str:
    """One line per metric; where it would pass the width, the name and verdict on one line and the figures
    indented below (a grep for a metric's verdict still finds one line)."""
    line = f"{m.metric:<{name_w}}  {_metric_figures(m)}  {m.verdict}"
    return line if len(line) <= width else f"{m.metric}  {m.verdict}\n    {_metric_figures(m)}"


def compact_lines(report: GateReport, width: int = PLAIN_WIDTH) -> list[str]:
    """Plain text (no markup, no box drawing): what a CI log or `| tee` shows."""
    out: list[str] = []

    def wrap(text: str, first: str, rest: str) -> None:
        out.extend(textwrap.wrap(text, width, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False))

    for c in report.candidates:
        gated = sorted((m for m in c.metrics if m.gated), key=lambda m: m.metric)
        name_w = min(max((len(m.metric) for m in gated), default=0), 30)
        wrap(f"{c.recipe} ({c.build_id}) vs {report.baseline_recipe}: {c.verdict}", "", "    ")
        out.extend(_metric_lines(m, name_w, width) for m in gated)
        if len(c.metrics) > len(gated):
            out.append(f"  ({len(c.metrics) - len(gated)} informational metrics: see gate.json / the report)")
        for text, label in _candidate_notes(c):
            wrap(text, label, "    ")
    if note := family_note(report):
        wrap(note, "family: ", "    ")
    out.append(f"gate {report.gate_id}: {report.verdict}")
    return [ln for chunk in out for ln in chunk.split("\n")]


def _candidate_notes(c: CandidateReport) -> list[tuple[str, str]]:
    """(text, label) for what follows a candidate's metric lines: notes, warnings, refusals, then the reasons."""
    notes = [(n, "  note: ") for n in filter(None, [seed_note(c), *reference_notes(c)])]
    notes += [(w, "  warning: ") for w in metric_warnings(c)] + [(r, "  refused: ") for r in c.integrity]
    return notes + ([(r, "  • ") for r in _reasons(c)] if c.verdict != "PASS" else [])


def _reasons(c) -> list[str]:
    """The candidate's reasons, less those that only repeat a refusal printed just above (issue 40.6)."""
    return [r for r in c.reasons if not any(i in r for i in c.integrity)][:8]


def render_compact(report: GateReport, console: Console, width: int = PLAIN_WIDTH) -> None:
    for line in compact_lines(report, width):
        console.print(line, highlight=False, markup=False, soft_wrap=True)


def render_table(report: GateReport, console: Console) -> None:
    for c in report.candidates:
        console.print(candidate_table(c, report.baseline_recipe))
        for note in filter(None, [seed_note(c), *reference_notes(c)]):
            console.print(f"[dim]note:[/] {note}", highlight=False)
        for w in metric_warnings(c):
            console.print(f"[yellow]warning:[/] {w}", highlight=False)
        for r in c.integrity:
            console.print(f"[red]refused:[/] {r}", highlight=False)
        if c.verdict != "PASS":
            for r in _reasons(c):
                console.print(f"  • {r}", highlight=False, markup=False)
    if note := family_note(report):
        console.print(f"[dim]family:[/] {note}", highlight=False)
    console.print(f"gate {report.gate_id}: [{STYLE[report.verdict]}]{report.verdict}[/]")


def render_looks(report: GateReport, console: Console) -> None:
    """The budgeted gate: each look's level, items and requests, and each metric's bounds at that look
    (one row per metric, so the table stays readable in an 80-column terminal). A fixed gate's one look is
    the table render() printed."""
    seq = report.config.get("sequential") or {}
    looks = seq.get("looks", [])
    if not looks or not budgeted(report):
        return
    t = Table(title=f"sequential gate {seq.get('id')}: {len(looks)} of {seq['plan']['looks']} planned looks",
              box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, collapse_padding=True)
    for col in ("look", "metric", "n", "Δ bounds", "verdict"):
        t.add_column(col, no_wrap=True)
    several = len({c for lk in looks for c in lk["metrics"]}) > 1
    for lk in looks:
        head = [str(lk["look"]), f"α {lk['level']:.4f}", f"{lk['requests']} req", f"{lk['seconds']:.0f} s"]
        rows = [(f"{cand}:{name}" if several else name, m) for cand, ms in lk["metrics"].items()
                for name, m in sorted(ms.items())]
        if not rows:
            t.add_row(" ".join(head), "(nothing left undecided)", "", "", "", end_section=True)
        for i, (name, m) in enumerate(rows):
            suite = name.split(":")[-1].split("/")[0]
            t.add_row(head[i] if i < len(head) else "", name, str(lk["items"].get(suite, "")),
                      f"[{m['lo']:+.3f}, {m['hi']:+.3f}]", f"[{STYLE[m['verdict']]}]{m['verdict']}[/]",
                      end_section=i == len(rows) - 1)
    console.print(t)
    last = looks[-1]
    console.print(f"the budget bought {last['requests']} requests in {last['seconds']:.0f}s"
                  + (f"; finite sources exhausted: {', '.join(last['exhausted'])}" if last.get("exhausted") else ""))
