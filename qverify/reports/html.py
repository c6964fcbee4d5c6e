"""report.html: one self-contained file (inline CSS, plots as base64 PNG), readable offline and in MLflow."""

from __future__ import annotations

import base64
from html import escape

from qverify.gate.render import reference_notes
from qverify.reports.flips import response_text
from qverify.reports.review import Review
from qverify.reports.rows import (
    CAPACITY_COLUMNS,
    PERF_COLUMNS,
    PLOT_TITLES,
    PROJECTION_COLUMNS,
    capacity_rows,
    flips_title,
    metric_rows,
    perf_rows,
    projection,
)

CSS = """
:root { --pass:#1a7f37; --fail:#cf222e; --inc:#9a6700; --muted:#57606a; --line:#d0d7de; --bg:#f6f8fa; }
* { box-sizing: border-box; }
body { font: 14px/1.5 -apple-system, "Segoe UI", "DejaVu Sans", Helvetica, Arial, sans-serif; color:#1f2328;
       max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 22px; margin: 0 0 12px; } h2 { font-size: 18px; margin: 32px 0 10px; border-bottom: 1px solid var(--line); padding-bottom: 4px; }
h3 { font-size: 15px; margin: 20px 0 8px; }
code, pre { font: 12px/1.45 "DejaVu Sans Mono", Menlo, Consolas, monospace; }
.verdict { border-radius: 8px; padding: 14px 18px; font-size: 16px; font-weight: 600; border: 1px solid; margin-bottom: 8px; }
.verdict.PASS { background:#dafbe1; border-color:var(--pass); } .verdict.FAIL { background:#ffebe9; border-color:var(--fail); }
.verdict.INCONCLUSIVE { background:#fff8c5; border-color:var(--inc); }
.meta { color: var(--muted); font-size: 13px; margin-bottom: 4px; }
.pill { display:inline-block; border-radius: 10px; padding: 0 8px; font-size: 12px; font-weight: 600; color: #fff; }
.pill.PASS { background: var(--pass); } .pill.FAIL { background: var(--fail); } .pill.INCONCLUSIVE { background: var(--inc); }
table { border-collapse: collapse; width: 100%; margin: 6px 0 12px; font-size: 12px; }
th, td { border-bottom: 1px solid var(--line); padding: 5px 7px; text-align: left; vertical-align: top; }
th { background: var(--bg); font-weight: 600; white-space: nowrap; }
td.num { font-variant-numeric: tabular-nums; white-space: nowrap; }
td.why { color: var(--muted); min-width: 220px; }
.sub { color: var(--muted); font-size: 11.5px; font-weight: normal; }
table.metrics td { white-space: nowrap; } table.metrics td:first-child { white-space: normal; max-width: 330px; }
tr.inform td { color: #3d444d; } tr.inform b { font-weight: 500; }
tr.FAIL td:first-child { box-shadow: inset 3px 0 var(--fail); } tr.INCONCLUSIVE td:first-child { box-shadow: inset 3px 0 var(--inc); }
ul.changes { margin: 4px 0 12px; padding-left: 20px; }
details { margin: 4px 0 12px; } summary { cursor: pointer; color: var(--muted); }
pre { background: var(--bg); border: 1px solid var(--line); border-radius: 6px; padding: 10px; overflow-x: auto; white-space: pre-wrap; word-break: break-word; margin: 0; }
.plots img { max-width: 100%; display: block; margin: 6px 0 18px; border: 1px solid var(--line); border-radius: 6px; }
.flip { border: 1px solid var(--line); border-radius: 8px; margin: 10px 0 16px; overflow: hidden; }
.flip .head { background: var(--bg); padding: 6px 10px; font-size: 13px; border-bottom: 1px solid var(--line); }
.flip .sides { display: grid; grid-template-columns: 1fr 1fr; gap: 0; }
.flip .side { padding: 8px 10px; } .flip .side + .side { border-left: 1px solid var(--line); }
.flip .label { font-size: 12px; font-weight: 600; color: var(--muted); margin-bottom: 4px; }
.regressed .head b { color: var(--fail); } .improved .head b { color: var(--pass); }
"""


def _table(cols: list[str], rows: list[list[str]], row_class: list[str] | None = None, num_from: int = 1) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = []
    for i, r in enumerate(rows):
        cells = []
        for j, v in enumerate(r):
            if cols[j] == "verdict":
                cells.append(f'<td><span class="pill {escape(v)}">{escape(v)}</span></td>')
            else:
                cls = "why" if cols[j] == "why" else "num" if j >= num_from else ""
                cells.append(f'<td class="{cls}">{escape(str(v))}</td>')
        cls = f' class="{row_class[i]}"' if row_class else ""
        body.append(f"<tr{cls}>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _metric_table(rows: list[dict[str, str]]) -> str:
    """Compact: the spread and the reason go on a second, muted line so the table fits the page."""
    cols = ["metric", "baseline", "candidate", "Δ", "one-sided bounds", "run SD", "tol", "MDE", "p / adj", "flips ↓↑", "verdict"]
    head = "".join(f"<th>{escape(c)}</th>" for c in cols)
    body = []
    for r in rows:
        sub = lambda s: f"<div class=sub>{escape(s)}</div>" if s else ""
        why = r["why"] if r["verdict"] != "PASS" else ""
        cells = [f"<td><b>{escape(r['metric'])}</b>{sub(r['gated'])}{sub(why)}</td>",
                 f"<td class=num>{escape(r['baseline'])}{sub(r['baseline_spread'])}</td>",
                 f"<td class=num>{escape(r['candidate'])}{sub(r['candidate_spread'])}</td>",
                 *(f"<td class=num>{escape(r[k])}</td>" for k in ("delta", "ci", "band", "tol", "mde", "p", "flips")),
                 f'<td><span class="pill {r["verdict"]}">{r["verdict"]}</span></td>']
        body.append(f'<tr class="{r["verdict"]}{" inform" if r["gated"] else ""}">{"".join(cells)}</tr>')
    return f"<table class=metrics><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _img(path) -> str:
    return f"@@IMG:{path.name}@@"


def embed_images(html: str, review: Review) -> str:
    """Replace the placeholders with base64 PNGs (after redaction, which need not scan megabytes of base64)."""
    for p in review.plots.values():
        data = base64.b64encode(p.read_bytes()).decode()
        html = html.replace(f"@@IMG:{p.name}@@", f'<img alt="{escape(p.stem)}" src="data:image/png;base64,{data}">')
    return html


def render_html(review: Review) -> str:
    b, g = review.bundle, review.bundle.gate
    h = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>Release review · {escape(g.gate_id)}</title>",
         f"<style>{CSS}</style></head><body>",
         f"<h1>Release review · gate <code>{escape(g.gate_id)}</code></h1>",
         f'<div class="verdict {g.verdict}">{escape(review.headline)}</div>',
         (f'<div class="meta">Baseline <code>{escape(g.baseline)}</code> ({escape(g.baseline_recipe)}) · '
          f"{len(g.candidates)} candidate(s) · model {escape(b.model)} · gate created {escape(g.created)}</div>"),
         ('<div class="meta">Rates in %, differences in percentage points. Noise band: where a re-run of the baseline '
          "itself lands. Flips: items right in every baseline replicate and wrong in every candidate one (↓), or the reverse (↑). "
          "Grey rows inform only; they do not gate.</div>")]
    for c in g.candidates:
        h.append(f'<h2>{escape(c.recipe)} <code>{escape(c.build_id[:12])}</code> <span class="pill {c.verdict}">{c.verdict}</span></h2>')
        if c.reasons:
            h.append("<ul class=changes>" + "".join(f"<li>{escape(r)}</li>" for r in c.reasons) + "</ul>")
        for note in reference_notes(c):  # greedy/match compared with the candidate's twin, not the baseline
            h.append(f'<div class="meta">note: {escape(note)}</div>')
        h.append(_metric_table(metric_rows(review, c.build_id)))
        h.append("<h3>What the recipe changed</h3><ul class=changes>"
                 + "".join(f"<li>{escape(x)}</li>" for x in review.changes[c.build_id]) + "</ul>")
        m = b.builds.get(c.build_id)
        if m and m.recipe_text:
            h.append(f"<details><summary>recipe {escape(m.recipe)} (hash {escape(m.recipe_hash[:12])})</summary>"
                     f"<pre>{escape(m.recipe_text)}</pre></details>")
    h += ["<h2>Capacity and size</h2>", _table(CAPACITY_COLUMNS, capacity_rows(review))]
    title, rows = projection(review)
    if rows:
        h += [f"<h3>{escape(title)}</h3>", _table(PROJECTION_COLUMNS, rows)]
    perf = perf_rows(review)
    h += ["<h2>Performance</h2>", _table(PERF_COLUMNS, perf) if perf else "<p>No performance figures were recorded in the runs.</p>"]
    if review.plots:
        h.append('<h2>Plots</h2><div class="plots">')
        h += [f"<h3>{escape(PLOT_TITLES[k])}</h3>{_img(p)}" for k, p in review.plots.items()]
        h.append("</div>")
    h.append("<h2>Top flipped items</h2>")
    for c in g.candidates:
        fl = review.flips[c.build_id]
        h.append(f"<h3>{escape(flips_title(review, c.build_id))}</h3>")
        for f in fl:
            h.append(
                f'<div class="flip {f.direction}"><div class="head"><b>{f.direction}</b> · {escape(f.suite)} · '
                f"<code>{escape(f.item_id)}</code> · {escape(f.metric)}"
                + "".join(f" · {escape(str(k))} {escape(str(v))}" for k, v in f.candidate.metadata.items()
                          if isinstance(v, (str, int, float)) and len(str(v)) < 40)
                + (f" · <i>{escape(f.candidate.reason)}</i>" if f.candidate.reason else "") + "</div>"
                f'<div class="sides"><div class="side"><div class="label">baseline ({escape(g.baseline_recipe)})</div>'
                f"<pre>{escape(response_text(f.baseline))}</pre></div>"
                f'<div class="side"><div class="label">candidate ({escape(c.recipe)})</div>'
                f"<pre>{escape(response_text(f.candidate))}</pre></div></div></div>")
    h += ["<h2>How to reproduce</h2>", f"<pre>{escape(chr(10).join(review.commands))}</pre>", "</body></html>"]
    return "\n".join(h)
