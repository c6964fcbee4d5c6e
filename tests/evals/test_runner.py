"""`qverify eval` against real local servers: pairing, resume after kills, faults, bounds, overflow."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter

import psutil
import pytest

from qverify.evals.runner import replicate_seed
from qverify.evals.store import RunStore
from qverify.models import ServingProfile
from qverify.pipeline import evaluate_build
from qverify.serve.local import LocalBackend
from qverify.workdir import Workdir
from tests.evals.conftest import FaultyProxy

KEY_VAR = "QV_TEST_LOCAL_SERVER_KEY"

LIMIT, REPS = 4, 2


def _cli(wd, *args):
    return [sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", *args]


def _servers(wd) -> list:
    return [c for c in psutil.process_iter(["cmdline"]) if "qverify.serve.embedded.server" in " ".join(c.info["cmdline"] or [])
            and str(wd) in " ".join(c.info["cmdline"] or [])]


def _lines(store: RunStore) -> int:
    return sum(len(store.results(k)) for k in store.replicates())


def _check_complete(store: RunStore, n_items: int, reps: int):
    seen = Counter()
    for k in store.replicates():
        raw = [ln for ln in store.replicate_path(k).read_text().splitlines() if ln.strip()]
        ok = [r for r in store.results(k) if r.error is None]
        assert len(ok) == n_items, f"replicate {k}: {len(ok)} results"
        for r in ok:
            seen[(r.item_id, r.replicate)] += 1
            assert r.seed == replicate_seed(r.item_id, r.replicate)
        # no result is duplicated: exactly one successful line per item; an infrastructure error
        # recorded when the server died may stand earlier in the file, superseded by the retry
        ok_lines = [json.loads(ln) for ln in raw if json.loads(ln)["error"] is None]
        assert len(ok_lines) == n_items == len({x["item_id"] for x in ok_lines}), "duplicated results"
    assert len(seen) == n_items * reps and set(seen.values()) == {1}


def test_paired_replicates_across_builds(bf16_build, tiny_model_dir, eval_workdir):
    """Two builds evaluated with the same suite get the same item ids and the same seeds."""
    from qverify.quantize.build import build

    other = build("fp8kv", model=tiny_model_dir, workdir=eval_workdir, calib_samples=8, calib_seq_len=64)
    wd = Workdir.at(eval_workdir)
    for b in (bf16_build, other):
        evaluate_build(wd, b.manifest.build_id, ["toolcall"], replicates=REPS, limit=LIMIT, show_progress=False)
    a = RunStore(wd.run_dir(bf16_build.manifest.build_id, "toolcall"))
    b = RunStore(wd.run_dir(other.manifest.build_id, "toolcall"))
    for k in range(REPS):
        pa = {(r.item_id, r.seed) for r in a.results(k)}
        pb = {(r.item_id, r.seed) for r in b.results(k)}
        assert pa == pb and len(pa) == LIMIT
    assert a.read_manifest().item_set_hash == b.read_manifest().item_set_hash
    assert a.read_manifest().complete and b.read_manifest().complete
    # TTFT from the streamed probe: measured client-side, so it cannot exceed the slowest whole request
    perf = a.read_manifest().perf
    assert 0 < perf["ttft_s"] <= perf["ttft_max_s"] <= max(r.latency_s for k in range(REPS) for r in a.results(k)) * 3
    assert perf["stream_decode_tok_s"] > 0


def _resume_setup(build, tmp_path):
    """A workdir holding the build, the store of its longctx run, and the eval command line."""
    wd = tmp_path / "wd"
    (wd / "builds").mkdir(parents=True)
    os.symlink(build.build_dir, wd / "builds" / build.manifest.build_id)
    store = RunStore(wd / "runs" / build.manifest.build_id / "longctx")
    args = _cli(wd, build.manifest.build_id, "--suites", "longctx", "--limit", "6", "--replicates", "2",
                "--concurrency", "1")
    return wd, store, args


def _wait_for_results(store: RunStore, n: int, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline and (not store.dir.exists() or _lines(store) < n):
        time.sleep(0.2)


def test_resume_after_killing_the_client(bf16_build, tmp_path):
    wd, store, args = _resume_setup(bf16_build, tmp_path)
    p = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _wait_for_results(store, 3)
    os.killpg(p.pid, signal.SIGKILL)  # the client only: its server runs in a session of its own
    p.wait()
    deadline = time.time() + 30  # the server notices its launcher is gone and exits: no orphan
    while time.time() < deadline and _servers(wd):
        time.sleep(0.5)
    assert not _servers(wd)
    partial = _lines(store)
    assert 0 < partial < 12
    subprocess.run(args, check=True, capture_output=True, timeout=600)
    _check_complete(store, 6, 2)


def test_resume_after_killing_the_server(bf16_build, tmp_path):
    wd, store, args = _resume_setup(bf16_build, tmp_path)
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_for_results(store, 3)
    servers = _servers(wd)
    assert servers, "the eval's server process was not found"
    for s in servers:
        s.kill()
    _, err = p.communicate(timeout=300)
    assert p.returncode == 3, err
    assert "server" in err.lower()
    subprocess.run(args, check=True, capture_output=True, timeout=600)
    _check_complete(store, 6, 2)


def test_piped_eval_output_reads_at_80_columns(bf16_build, tmp_path):
    """`qverify eval ... | tee log`: stdout is not a terminal, so the summary is plain lines within 80 columns
    with every name and number whole (rich's table cut them to "toolc…", "exact…", "0.575…")."""
    wd = tmp_path / "wd"
    (wd / "builds").mkdir(parents=True)
    os.symlink(bf16_build.build_dir, wd / "builds" / bf16_build.manifest.build_id)
    r = subprocess.run(_cli(wd, bf16_build.manifest.build_id, "--suites", "toolcall", "--limit", "4", "--replicates", "2"),
                       capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "80"}, check=False)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines and max(map(len, lines)) <= 80 and "…" not in r.stdout, r.stdout
    m = RunStore(wd / "runs" / bf16_build.manifest.build_id / "toolcall").read_manifest()
    assert m is not None and m.complete
    assert "toolcall" in r.stdout and "metric: exact_call" in r.stdout and "complete: yes" in r.stdout, r.stdout


@pytest.fixture(scope="module")
def served(bf16_build, tmp_path_factory):
    backend = LocalBackend(bf16_build.build_dir, bf16_build.manifest, ServingProfile(), tmp_path_factory.mktemp("logs"))
    with backend:
        os.environ[KEY_VAR] = backend.api_key  # the server's per-launch key, for the endpoint backend below
        yield backend


def test_faults_are_retried_classified_and_never_scored(bf16_build, served, tmp_path):
    from qverify.evals import client as client_mod
    from qverify.suites.toolcall import generate_toolcall_items

    victim = generate_toolcall_items("toolcall", "test", LIMIT, 0)[1].messages[0]["content"]
    wd = Workdir.at(tmp_path / "wd")
    wd.builds.mkdir(parents=True)
    os.symlink(bf16_build.build_dir, wd.builds / bf16_build.manifest.build_id)
    old = client_mod.Client.__init__.__defaults__
    # a short timeout so the injected hang times out quickly; retries as in production
    client_mod.Client.__init__.__defaults__ = (8, None, 4, 0.05)  # fast backoff; retries as in production
    try:
        with FaultyProxy(served.root_url, fail_first=1, hang_first=1, always_fail=victim, hang_s=25.0) as proxy:
            prof = ServingProfile(name="endpoint", backend="endpoint", api_key_env=KEY_VAR, endpoint=proxy.url)
            out = evaluate_build(wd, bf16_build.manifest.build_id, ["toolcall"], replicates=REPS, serving=prof,
                                 limit=LIMIT, concurrency=3, show_progress=False, read_timeout_s=15.0)
    finally:
        client_mod.Client.__init__.__defaults__ = old
    store = RunStore(wd.run_dir(bf16_build.manifest.build_id, "toolcall"))
    rows = [r for k in store.replicates() for r in store.results(k)]
    errs = [r for r in rows if r.error]
    assert {r.error for r in errs} == {"http_5xx"} and len(errs) == REPS  # only the victim, once per replicate
    assert all(not r.scores and r.response is None for r in errs)  # an infra error is never a wrong answer
    assert all(r.scores and r.metadata["attempts"] == 3 for r in rows if not r.error)  # hang → 503 → ok
    assert proxy.peak <= 3  # the concurrency bound held
    m = store.read_manifest()
    assert m.error_rate == pytest.approx(REPS / (LIMIT * REPS)) and not m.complete  # 25% > 2% budget
    assert out[0].errors == REPS


def test_context_overflow_is_a_per_item_error(bf16_build, served, tmp_path):
    wd = Workdir.at(tmp_path / "wd")
    wd.builds.mkdir(parents=True)
    os.symlink(bf16_build.build_dir, wd.builds / bf16_build.manifest.build_id)
    prof = ServingProfile(name="endpoint", backend="endpoint", api_key_env=KEY_VAR, endpoint=served.root_url)
    evaluate_build(wd, bf16_build.manifest.build_id, ["longctx"], replicates=1, serving=prof, limit=2,
                   show_progress=False, suite_options={"longctx": {"lengths": [256, 2600]}})
    rows = RunStore(wd.run_dir(bf16_build.manifest.build_id, "longctx")).results(0)
    by_len = {r.item_id: r for r in rows}
    assert len(rows) == 2
    assert sorted((r.error or "ok") for r in by_len.values()) == ["context_overflow", "ok"]
