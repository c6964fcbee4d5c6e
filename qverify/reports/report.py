"""The release-review report: report.md (plots linked) and report.html (one self-contained file).

Order is what a release reviewer needs, first thing first: the verdict in one sentence,
the per-metric table, what the recipe changed, what it buys (capacity, size, speed),
the items that flipped with both responses side by side, and how to reproduce.
"""

from __future__ import annotations

from pathlib import Path

from qverify.reports.facts import fmt_bytes, fmt_tokens
from qverify.reports.flips import response_text
from qverify.reports.review import Review, fmt_delta, fmt_flips, fmt_p, fmt_spread, fmt_value

METRIC_COLUMNS = ["metric", "baseline", "candidate", "Δ", "95% CI", "noise band", "tol", "MDE", "p / adj", "flips ↓↑", "verdict", "why"]
PLOT_TITLES = {
    "forest": "Δ against the noise band, per metric", "longctx": "Long-context accuracy by length",
    "replicates": "Replicate spread per suite", "capacity": "Weights size and KV capacity", "accept_length": "Accept length",
}


def metric_rows(review: Review, build_id: str) -> list[dict[str, str]]:
    """Formatted cells per metric; rates in % and percentage points, distances raw."""
    rows = []
    for m in review.bundle.candidate(build_id).metrics:
        rows.append({
            "metric": m.metric, "gated": "" if m.gated else "inform only",
            "baseline": fmt_value(m, m.baseline_mean), "baseline_spread": fmt_spread(m, m.baseline_spread),
            "candidate": fmt_value(m, m.candidate_mean), "candidate_spread": fmt_spread(m, m.candidate_spread),
            "delta": fmt_delta(m, m.delta),
            "ci": f"[{fmt_delta(m, m.ci_low, unit=False)}, {fmt_delta(m, m.ci_high, unit=False)}]",
            "band": "±" + fmt_delta(m, m.noise_band, signed=False, unit=False),
            "tol": fmt_delta(m, m.tolerance, signed=False, unit=False), "mde": fmt_delta(m, m.mde, signed=False, unit=False),
            "p": fmt_p(m), "flips": fmt_flips(m), "verdict": m.verdict,
            "why": m.reason + (f" {m.advice}" if m.advice else ""),
        })
    return rows


def _md_metric_row(r: dict[str, str]) -> list[str]:
    sp = lambda v, s: v + (f" [{s}]" if s else "")
    return [r["metric"] + (f" ({r['gated']})" if r["gated"] else ""), sp(r["baseline"], r["baseline_spread"]),
            sp(r["candidate"], r["candidate_spread"]), r["delta"], r["ci"], r["band"], r["tol"], r["mde"], r["p"],
            r["flips"], r["verdict"], r["why"]]


CAPACITY_COLUMNS = ["build", "weights", "weights Δ", "KV dtype", "KV bytes/token", "KV tokens per GiB"]
PROJECTION_COLUMNS = ["build", "weights", "weights per GPU", "KV tokens per replica", "sessions"]


def capacity_rows(review: Review) -> list[list[str]]:
    return [[f"{f.recipe} ({f.build_id[:8]})", fmt_bytes(f.weights_bytes),
             f"{100 * f.weights_change:+.1f}%" if f.weights_change else "–", f.kv_dtype or "–",
             f"{f.kv_bytes_per_token:,}" if f.kv_bytes_per_token else "–",
             fmt_tokens(f.kv_tokens_per_gib) + (f" (×{f.kv_tokens_ratio:.2f})" if f.kv_tokens_ratio and f.kv_tokens_ratio != 1 else "")]
            for f in review.facts]


def projection(review: Review) -> tuple[str, list[list[str]]]:
    """The capacity planner's view of each recipe on the production model: a title and rows (empty without it)."""
    ps = [(f, f.projection) for f in review.facts if f.projection]
    p0 = next((p for _, p in ps if "error" not in p), None)
    if p0 is None:
        return "", []
    title = (f"{p0['model']} with the same recipes on {p0['tp']}× {p0['gpu'].upper()} "
             f"(qverify capacity; sessions at {p0['context']:,} tokens)")
    rows = [[f.recipe, "–", "–", f"not priced: {p['error']}", "–"] if "error" in p else
            [f.recipe, fmt_bytes(p["weights_bytes"]), fmt_bytes(p["weights_bytes"] / p["tp"]),
             fmt_tokens(p["kv_tokens_per_replica"]) + ("" if p["fits"] else " (does not fit)"), f"{p['sessions']:,}"]
            for f, p in ps]
    return title, rows


def perf_rows(review: Review) -> list[list[str]]:
    if not any(f.ttft_s or f.decode_tok_s or f.accept_length for f in review.facts):
        return []
    return [[f"{f.recipe} ({f.build_id[:8]})",
             f"{1000 * f.ttft_s:.1f} ms" if f.ttft_s is not None else "–",
             f"{f.decode_tok_s:,.1f}" if f.decode_tok_s is not None else "–",
             f"{f.accept_length:.2f}" if f.accept_length is not None else "–"] for f in review.facts]


PERF_COLUMNS = ["build", "TTFT", "decode tok/s", "accept length"]


def flips_title(review: Review, build_id: str) -> str:
    n = review.flip_counts[build_id]
    shown = len(review.flips[build_id])
    total = n["regressed"] + n["improved"]
    if not total:
        return f"{review.bundle.recipe(build_id)}: no item flipped"
    return (f"{review.bundle.recipe(build_id)}: {total} items flipped ({n['regressed']} regressed, {n['improved']} improved)"
            + (f", {shown} shown" if shown < total else ""))


def _md_table(cols: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(esc(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(review: Review, plots_rel: str = "plots") -> str:
    g = review.bundle.gate
    md = [f"# Release review · gate `{g.gate_id}`", "", f"**{review.headline}**", "",
          f"Baseline `{g.baseline}` ({g.baseline_recipe}); {len(g.candidates)} candidate(s); gate created {g.created}.", ""]
    for c in g.candidates:
        md += [f"## {c.recipe} (`{c.build_id}`): {c.verdict}", ""]
        md += [f"- {r}" for r in c.reasons] + ([""] if c.reasons else [])
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
            md += [f"**{f.suite} · `{f.item_id}` · {f.direction}** ({f.metric}; candidate: {f.candidate.reason or 'ok'})", "",
                   "Baseline:", "", "```", response_text(f.baseline), "```", "", "Candidate:", "", "```", response_text(f.candidate), "```", ""]
    md += ["## How to reproduce", "", "```bash", *review.commands, "```", ""]
    return "\n".join(md)


def write_report(review: Review, out_dir: Path) -> tuple[Path, Path]:
    from qverify.reports.html import embed_images, render_html
    from qverify.reports.redact import redact_text

    out_dir.mkdir(parents=True, exist_ok=True)
    md_path, html_path = out_dir / "report.md", out_dir / "report.html"
    md_path.write_text(redact_text(render_markdown(review)))
    html_path.write_text(embed_images(redact_text(render_html(review)), review))
    return md_path, html_path
