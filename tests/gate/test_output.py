"""The gate's output for humans and for logs, and its refusal to mix sandboxed and unsandboxed runs.

Piped (as in CI and `scripts/main.sh 2>&1 | tee`), the gate prints a compact summary: one line per
gated metric with its delta, CI, tolerance and verdict, then the verdict line, every line <= 80 columns (README's promise for piped output).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qverify.config import QVerifyConfig
from qverify.gate import exit_code, run_gate
from tests import synth

N, K = 120, 3
WIDTH = 80  # qverify.output.PLAIN_WIDTH


def _put(wd: Path, build: str, suite: str, scores: dict[str, np.ndarray], sandbox: str | None = None) -> None:
    if not (wd / "builds" / build / "build.json").exists():
        synth.write_build(wd / "builds", build, recipe=f"{build}_recipe_with_a_long_name")
    n = next(iter(scores.values())).shape[0]
    store = synth.write_run(wd / "runs", build, suite, synth.results(suite, synth.item_ids(suite, n), scores))
    if sandbox is not None:
        m = store.read_manifest()
        m.sandbox = sandbox
        store.write_manifest(m)


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("gateout")
    rng = np.random.default_rng(7)
    p = np.where(rng.random(N) < 0.7, 1.0, 0.0)
    p = np.where(rng.random(N) < 0.2, 0.5, p)
    for build in ("base", "cand", "weakcand"):
        sandbox = "unsandboxed" if build == "weakcand" else "bwrap"
        _put(wd, build, "coding", {"pass@1": synth.bernoulli(p, K, rng)}, sandbox=sandbox)
        trig = synth.bernoulli(np.full(N, 0.97), K, rng)
        _put(wd, build, "toolcall", {"exact_call": synth.bernoulli(p, K, rng) * trig, "trigger": trig})
    return wd


def _gate(wd: Path, *args: str, columns: str | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd), "gate", "--no-report", "--fixed",
                           "--baseline", "base", "--suites", "coding,toolcall", *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.parametrize("columns", [None, "60", "250"])
def test_piped_gate_is_a_compact_summary_within_80_columns(wd, columns):
    js = _gate(wd, "--candidate", "cand", "--json")
    report = json.loads(js.stdout)
    gated = [m for c in report["candidates"] for m in c["metrics"] if m["gated"]]
    assert gated
    p = _gate(wd, "--candidate", "cand", columns=columns)
    assert p.returncode == js.returncode, p.stderr
    lines = p.stdout.splitlines()
    too_wide = [ln for ln in lines if len(ln) > WIDTH]
    assert not too_wide, too_wide
    for m in gated:  # one line each, carrying delta, CI, tolerance and verdict (a long name on a line of its own)
        mine = [i for i, ln in enumerate(lines) if ln.split() and ln.split()[0] == m["metric"]]
        assert len(mine) == 1, (m["metric"], p.stdout)
        ln = lines[mine[0]] if lines[mine[0]].strip() != m["metric"] else lines[mine[0]] + lines[mine[0] + 1]
        assert f"{m['delta']:+.3f}" in ln and f"[{m['ci_low']:+.3f}, {m['ci_high']:+.3f}]" in ln
        assert "tol" in ln and m["verdict"] in ln
    assert lines[-1] == f"gate {report['gate_id']}: {report['verdict']}"
    assert "━" not in p.stdout and "│" not in p.stdout  # no table drawing in a log


def test_a_terminal_gets_the_table(wd):
    """On a TTY (rich decides: here forced as a wide terminal) the full table stays."""
    from rich.console import Console

    from qverify.gate.render import render

    report = run_gate(wd, "base", ["cand"], suites=["coding", "toolcall"], config=QVerifyConfig(),
                      write=False)
    con = Console(force_terminal=True, width=200, record=True)
    render(report, con)
    text = con.export_text()
    assert "run SD" in text and "┃" in text or "│" in text


def test_the_table_says_how_many_items_each_metric_was_decided_on(wd):
    """A metric computed on a subset of the items (KL where only some responses had logprobs) shows it (#31)."""
    from rich.console import Console

    from qverify.gate.render import candidate_table

    report = run_gate(wd, "base", ["cand"], suites=["coding", "toolcall"], config=QVerifyConfig(), write=False)
    c = report.candidates[0]
    con = Console(force_terminal=True, width=250, record=True, file=open(os.devnull, "w"))
    con.print(candidate_table(c, "base"))
    text = con.export_text()  # (export_text clears the record: read it once)
    header = next(ln for ln in text.splitlines() if "metric" in ln and "verdict" in ln)
    assert "items" in header
    rows = {ln.split("│")[1].strip(): [x.strip() for x in ln.split("│")] for ln in text.splitlines()
            if ln.count("│") > 5}
    cols = [x.strip() for x in header.split("┃")]
    for m in c.metrics:
        assert m.n_items and rows[m.metric][cols.index("items")] == str(m.n_items), (m.metric, rows.get(m.metric))


def test_gate_refuses_to_compare_sandboxed_with_unsandboxed(wd):
    report = run_gate(wd, "base", ["weakcand"], suites=["coding", "toolcall"], config=QVerifyConfig(),
                      write=False)
    c = report.candidates[0]
    assert c.verdict != "PASS" and exit_code(report) == 3
    assert any("sandbox" in r and "coding" in r for r in c.integrity), c.integrity
    # the comparable suite is still measured; coding is not
    assert {m.metric.split("/")[0] for m in c.metrics} == {"toolcall"}


def test_the_sequence_table_keeps_each_metric_on_one_line_in_80_columns():
    """The per-look table once put every metric of a look in one folded cell (unreadable in a terminal)."""
    from rich.console import Console

    from qverify.gate.render import render_looks
    from qverify.models import GateReport

    names = ["coding/pass@1", "verifier/hygiene/leaked_markup", "toolcall/exact_call"]
    looks = [{"look": j, "level": 0.0093, "items": {"coding": 200 * j, "verifier": 200 * j, "toolcall": 200 * j},
              "requests": 6000 * j, "seconds": 95.0 * j, "exhausted": [],
              "metrics": {"cand-1": {n: {"verdict": "INCONCLUSIVE", "delta": -0.01, "lo": -0.051, "hi": 0.032,
                                         "n": 200 * j} for n in names}}} for j in (1, 2)]
    report = GateReport(gate_id="g", baseline="b", verdict="INCONCLUSIVE", candidates=[],
                        config={"sequential": {"id": "seq-1", "plan": {"looks": 8, "budget_requests": 48000},
                                                "looks": looks}})
    console = Console(width=80, record=True, color_system=None)
    render_looks(report, console)
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for n in names:
        assert sum(n in line and "INCONCLUSIVE" in line and "[-0.051, +0.032]" in line for line in lines) == 2
