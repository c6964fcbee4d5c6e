"""The local release review (no MLflow): report.md, self-contained report.html, plots, items parquet."""

from __future__ import annotations

import re
import subprocess

import pandas as pd
import pytest

from qverify.errors import BadInput
from qverify.models import GateReport
from qverify.reports.artifacts import stage
from qverify.reports.bundle import load_gate

from .conftest import REPO, chromium, chromium_args
from .fixtures import build_id


@pytest.fixture(scope="module")
def staged(workdir):
    return stage(load_gate(workdir, "g-main"))


def test_verdict_comes_first_in_one_sentence(staged):
    md = staged.report_md.read_text()
    first = [line for line in md.splitlines() if line.strip()][1]
    assert first.startswith("**FAIL: against the bf16 baseline, fp8kv_nvfp4shared passes")
    assert "nvfp4_all fails on" in first and first.count(". ") == 0  # one sentence
    html = staged.report_html.read_text()
    assert html.index('class="verdict FAIL"') < html.index("<table")


def test_per_metric_table_matches_gate_json(staged, workdir):
    gate = GateReport.model_validate_json((workdir / "gates" / "g-main" / "gate.json").read_text())
    md = staged.report_md.read_text()
    for c in gate.candidates:
        for m in c.metrics:
            row = next(line for line in md.splitlines() if line.startswith(f"| {m.metric}") and
                       (f"{100 * m.candidate_mean:.1f}%" in line or f"{m.candidate_mean:.4g}" in line))
            assert m.verdict in row
    pass_at_1 = next(m for m in gate.candidates[1].metrics if m.metric == "coding/pass@1")
    assert f"{100 * pass_at_1.delta:+.1f}".replace("-", "−") + " pts" in md


def test_sections_recipe_capacity_performance_flips_reproduce(staged):
    md = staged.report_md.read_text()
    order = ["## fp8kv_nvfp4shared", "**What the recipe changed**", "## Capacity and size", "## Performance", "## Plots",
             "## Top flipped items", "## How to reproduce"]
    assert [md.index(s) for s in order] == sorted(md.index(s) for s in order)
    assert "KV cache bf16 → fp8_e4m3" in md and "NVFP4 on 9 Linear modules" in md
    assert "621k (×2.00)" in md  # FP8 KV doubles the KV tokens per GiB
    assert "-7.0%" in md  # NVFP4 shared experts: 7% smaller weights
    assert "| fp8kv_nvfp4shared (47c5d4e8) | 21.2 ms | 408.4 | 2.58 |" in md
    assert re.search(r"nvfp4_all: \d+ items flipped \(\d+ regressed", md)
    assert f"qverify --workdir {staged.review.bundle.workdir} gate --baseline {build_id('bf16')}" in md
    assert "report --gate g-main" in md


def test_flipped_items_show_both_responses(staged):
    flips = staged.review.flips[build_id("nvfp4_all")]
    assert flips and flips[0].direction == "regressed"
    assert len({f.suite for f in flips}) > 1  # suites take turns
    html = staged.report_html.read_text()
    f = flips[0]
    block = html[html.index(f.item_id):]
    assert block.index("baseline (bf16)") < block.index("candidate (nvfp4_all)")


def test_html_is_self_contained_with_plots(staged):
    html = staged.report_html.read_text()
    assert set(staged.plots) == {"forest", "longctx", "replicates", "capacity", "accept_length"}
    assert html.count('src="data:image/png;base64,') == len(staged.plots)
    assert not re.search(r'(src|href)="(?!data:)', html)  # nothing external to load
    assert "<style>" in html


def test_items_parquet_has_every_result(staged):
    df = pd.read_parquet(staged.items[(build_id("nvfp4_all"), "coding")])
    assert len(df) == 24 * 3 and {"item_id", "replicate", "score.pass@1", "response"} <= set(df.columns)


def test_unknown_gate_is_bad_input(workdir):
    with pytest.raises(BadInput, match="no gate 'nope'"):
        load_gate(workdir, "nope")
    with pytest.raises(BadInput, match="not a valid id"):
        load_gate(workdir, "../etc")


def test_report_screenshot(staged, tmp_path):
    """Render report.html in headless Chromium and keep the picture for the README (docs/img/report.png)."""
    exe = chromium()
    out = REPO / "docs" / "img" / "report.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    cmd = chromium_args(exe, tmp_path / "profile") + [f"--screenshot={out}", "--window-size=1280,1500",
                                                       staged.report_html.as_uri()]
    subprocess.run(cmd, check=True, capture_output=True, timeout=120)
    assert out.stat().st_size > 50_000


def test_model_output_cannot_leave_its_code_block(staged):
    """#37: a line of ``` in a response closed report.md's fence, and the Markdown after it ran a script."""
    from markdown_it import MarkdownIt

    from qverify.reports.report import render_markdown

    hostile = "ok\n```\n<script>alert(1)</script>\n````\n<img src=x onerror=alert(2)>\n"
    flip = staged.review.flips[build_id("nvfp4_all")][0]
    response, reason = flip.candidate.response, flip.candidate.reason
    try:
        flip.candidate.response = response.model_copy(update={"content": hostile})
        flip.candidate.reason = "SyntaxError: ``` <script>alert(3)</script>"
        tokens = MarkdownIt("commonmark").parse(render_markdown(staged.review))
    finally:
        flip.candidate.response, flip.candidate.reason = response, reason
    live = [t for t in tokens if t.type == "html_block"]
    live += [c for t in tokens if t.type == "inline" for c in t.children or [] if c.type == "html_inline"]
    assert not [t.content for t in live if "alert" in t.content]
    assert any(t.type == "fence" and "<script>alert(1)</script>" in t.content for t in tokens)
