"""The release-review report: report.md (plots linked) and report.html (one self-contained file).

Order is what a release reviewer needs, first thing first: the verdict in one sentence,
the per-metric table, what the recipe changed, what it buys (capacity, size, speed),
the items that flipped with both responses side by side, and how to reproduce.
"""

from __future__ import annotations

import re
from pathlib import Path

from qverify.gate.render import reference_notes
from qverify.reports.flips import response_text
from qverify.reports.html import embed_images, render_html
from qverify.reports.redact import redact_text
from qverify.reports.review import Review
from qverify.reports.rows import (
    CAPACITY_COLUMNS,
    METRIC_COLUMNS,
    PERF_COLUMNS,
    PLOT_TITLES,
    PROJECTION_COLUMNS,
    capacity_rows,
    flips_title,
    metric_rows,
    perf_rows,
    projection,
)


def _md_metric_row(r: dict[str, str]) -> list[str]:
    sp = lambda v, s: v + (f" [{s}]" if s else "")
    return [r["metric"] + (f" ({r['gated']})" if r["gated"] else ""), sp(r["baseline"], r["baseline_spread"]),
            sp(r["candidate"], r["candidate_spread"]), r["delta"], r["ci"], r["band"], r["tol"], r["mde"], r["p"],
            r["flips"], r["verdict"], r["why"]]


def _md_table(cols: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)


def fenced(text: str, info: str = "") -> list[str]:
    """A code block `text` cannot close: a line of ``` in model output ended a 3-backtick fence, and what followed
    was live Markdown (a <script> ran). CommonMark closes a fence only with at least as many backticks."""
    fence = "`" * max(3, _longest_backtick_run(text) + 1)
    return [fence + info, text, fence]


def code_span(text: str) -> str:
    """Inline code `text` cannot leave (a backtick run one longer than any inside it)."""
    ticks = "`" * (_longest_backtick_run(text) + 1)
    return f"{ticks} {text.replace(chr(10), ' ')} {ticks}"


def render_markdown(review: Review, plots_rel: str = "plots") -> str:
    g = review.bundle.gate
    md = [f"# Release review · gate `{g.gate_id}`", "", f"**{review.headline}**", "",
          f"Baseline `{g.baseline}` ({g.baseline_recipe}); {len(g.candidates)} candidate(s); gate created {g.created}.", ""]
    for c in g.candidates:
        md += [f"## {c.recipe} (`{c.build_id}`): {c.verdict}", ""]
        md += [f"- {r}" for r in c.reasons] + ([""] if c.reasons else [])
        md += [f"- note: {n}" for n in reference_notes(c)] + ([""] if c.compared_with else [])
        md += [_md_table(METRIC_COLUMNS, [_md_metric_row(r) for r in metric_rows(review, c.build_id)]), ""]
        md += ["**What the recipe changed**", ""] + [f"- {x}" for x in review.changes[c.build_id]] + [""]
    md += ["## Capacity and size", "", _md_table(CAPACITY_COLUMNS, capacity_rows(review)), ""]
    title, rows = projection(review)
    if rows:
        md += [f"**{title}**", "", _md_table(PROJECTION_COLUMNS, rows), ""]
    perf = perf_rows(review)
    md += ["## Performance", "", _md_table(PERF_COLUMNS, perf) if perf else "No performance figures were recorded in the runs.", ""]
    md += ["## Plots", ""] + [f"![{PLOT_TITLES[k]}]({plots_rel}/{p.name})" for k, p in review.plots.items()] + [""]
    md += ["## Top flipped items", ""]
    for c in g.candidates:
        fl = review.flips[c.build_id]
        md += [f"### {flips_title(review, c.build_id)}", ""]
        for f in fl:
            reason = code_span(f.candidate.reason) if f.candidate.reason else "ok"  # the reason can quote the model
            md += [f"**{f.suite} · `{f.item_id}` · {f.direction}** ({f.metric}; candidate: {reason})", "",
                   "Baseline:", "", *fenced(response_text(f.baseline)), "", "Candidate:", "",
                   *fenced(response_text(f.candidate)), ""]
    md += ["## How to reproduce", "", *fenced("\n".join(review.commands), "bash"), ""]
    return "\n".join(md)


def write_report(review: Review, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(redact_text(render_markdown(review)))
    html_path.write_text(embed_images(redact_text(render_html(review)), review))
    return md_path, html_path
