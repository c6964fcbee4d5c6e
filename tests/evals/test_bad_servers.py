"""`qverify eval` against real misbehaving HTTP servers (tests/badserver.py): garbage, hangs, nothing there.

Each runs the real CLI in a subprocess, so exit codes, stderr and what lands on disk are what a user gets.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

from qverify.evals.store import RunStore
from qverify.serve.base import free_port
from tests.badserver import GARBAGE, BadServer


def _workdir(build, tmp_path: Path) -> Path:
    wd = tmp_path / "wd"
    (wd / "builds").mkdir(parents=True)
    os.symlink(build.build_dir, wd / "builds" / build.manifest.build_id)
    return wd


def _eval(wd: Path, build, url: str, *args: str, env: dict | None = None, timeout: float = 300):
    cmd = [sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", build.manifest.build_id,
           "--backend", "endpoint", "--endpoint", url, *args]
    t0 = time.monotonic()
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    return r, time.monotonic() - t0


def _error_lines(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ln.strip()]


def test_garbage_responses_are_per_item_errors_and_results_are_saved(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    n = len(GARBAGE)
    with BadServer("garbage") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", str(n), "--replicates", "1")
    assert "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr  # the run is incomplete (errors over budget): infrastructure, not FAIL
    store = RunStore(wd / "runs" / bf16_build.manifest.build_id / "toolcall")
    rows = store.results(0)
    assert len(rows) == n  # every item has a stored result
    errors = [x for x in rows if x.error]
    assert {x.error for x in errors} == {"bad_response"}
    assert len(errors) >= n - 2  # shape 0 is valid; one wrong-type usage may be tolerated, nothing else
    assert all(x.response is None and not x.scores for x in errors)  # never scored
    assert all(x.metadata.get("error_detail") for x in errors)  # and the why is kept
    ok = [x for x in rows if not x.error]
    assert ok and all(x.scores for x in ok)
    m = store.read_manifest()
    assert m is not None and not m.complete and m.error_rate > 0.5


def test_a_complete_eval_is_a_no_op_that_needs_no_server(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    with BadServer("canned") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "coding,toolcall", "--limit", "2", "--replicates", "2",
                     "--allow-unsandboxed")
    assert r.returncode == 0, r.stderr
    run_dir = wd / "runs" / bf16_build.manifest.build_id
    before = {p: p.read_bytes() for p in sorted(wd.rglob("*")) if p.is_file()}
    assert "ttft_s" in RunStore(run_dir / "toolcall").read_manifest().perf

    from qverify.gate.loader import load

    prints = [load(wd / "runs", bf16_build.manifest.build_id, s).fingerprint for s in ("coding", "toolcall")]
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r, secs = _eval(wd, bf16_build, dead, "--suites", "coding,toolcall", "--limit", "2", "--replicates", "2",
                    "--allow-unsandboxed")
    assert r.returncode == 0, r.stderr
    after = {p: p.read_bytes() for p in sorted(wd.rglob("*")) if p.is_file()}
    assert after == before  # nothing written: manifests byte-identical, no log of an endpoint attach
    assert [load(wd / "runs", bf16_build.manifest.build_id, s).fingerprint for s in ("coding", "toolcall")] == prints


def test_a_hanging_server_costs_the_configured_bound(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    with BadServer("hang", hang_s=120) as srv:
        r, secs = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", "2", "--replicates", "1",
                        "--read-timeout", "1", "--item-timeout", "3")
    assert r.returncode == 3, r.stderr
    rows = RunStore(wd / "runs" / bf16_build.manifest.build_id / "toolcall").results(0)
    assert len(rows) == 2 and {x.error for x in rows} == {"timeout"}
    assert all(x.latency_s <= 3.5 for x in rows)  # the per-item total held, retries included
    assert secs < 60, secs  # was 300 s x 5 attempts per item; startup (imports) is most of this


def test_an_unreachable_endpoint_fails_fast_with_one_line(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    dead = f"http://127.0.0.1:{free_port()}"
    r, _ = _eval(wd, bf16_build, dead, "--suites", "toolcall", "--limit", "2", "--replicates", "1")
    assert r.returncode == 3, r.stderr
    lines = _error_lines(r.stderr)
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error:") and dead in lines[0] and "/health" in lines[0] and "fix:" in lines[0]
    # gave up at the unreachable bound (5 s), not the ready timeout (60 s): the process's own wait, which leaves out
    # its start-up (imports), so the bound holds on a loaded machine too
    waited = int(re.search(r"did not answer within (\d+)s", lines[0]).group(1))
    assert waited < 30, lines[0]
