"""Local first: a dead tracking server fails fast, never touches the verdict, and the replay loses nothing.

Also the two leftovers a failed upload really leaves: runs FAILED after an error mid-upload
(here: the artifact store is unwritable), and runs still RUNNING after a killed server
(made here with MlflowClient exactly as such an upload leaves them).
"""

from __future__ import annotations

import io
import socket
import time

import pytest
from rich.console import Console

from qverify.errors import ExitCode, InfraError
from qverify.output import Output
from qverify.reports.publish import report_after_gate
from qverify.reports.tracking import TrackingError, ensure_experiment, resolve, session
from qverify.reports.upload import upload_gate

from .fixtures import make_gate


@pytest.fixture(scope="module")
def wd(tmp_path_factory):
    wd = tmp_path_factory.mktemp("replay") / "wd"
    make_gate(wd, "g-r", ["fp8kv_nvfp4shared"])
    return wd


@pytest.fixture(scope="module")
def dead_uri() -> str:
    with socket.socket() as s:  # bound then closed: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _files(client, rid, path=None) -> set[str]:
    out: set[str] = set()
    for f in client.list_artifacts(rid, path):
        out |= _files(client, rid, f.path) if f.is_dir else {f.path}
    return out


def test_dead_server_fails_fast_with_replay_command(wd, dead_uri):
    gate_json = (wd / "gates" / "g-r" / "gate.json").read_bytes()
    t0 = time.monotonic()
    with pytest.raises(TrackingError) as err:
        upload_gate(wd, "g-r", tracking_uri=dead_uri)
    elapsed = time.monotonic() - t0
    # a regression guard against MLflow's default retries (247 s per call here), not a speed benchmark
    assert elapsed < 60, f"dead server took {elapsed:.0f}s to fail"
    e = err.value
    assert isinstance(e, InfraError) and e.exit_code == ExitCode.INFRA
    assert e.replay == f"qverify --workdir {wd} report --gate g-r --tracking-uri {dead_uri}"
    assert "the verdict stands" in e.one_line() and "while connecting" in str(e)
    assert (wd / "gates" / "g-r" / "report" / "report.html").exists()  # local first: the review exists anyway
    assert (wd / "gates" / "g-r" / "gate.json").read_bytes() == gate_json


def test_report_after_gate_warns_and_returns_3(wd, dead_uri):
    buf = io.StringIO()
    out = Output(err=Console(file=buf, width=400))
    assert report_after_gate(wd, "g-r", dead_uri, out=out) == 3
    text = buf.getvalue()
    assert "the verdict stands" in text and f"replay with: qverify --workdir {wd} report --gate g-r" in text


@pytest.mark.slow
def test_replay_to_sqlite_loses_nothing(wd):
    res = upload_gate(wd, "g-r")
    assert not res.skipped and not res.superseded
    staged = wd / "gates" / "g-r" / "report"
    with session(resolve(wd)) as client:
        uploaded = _files(client, res.run_id)
        assert {"gate.json", "report.md", "report.html"} | {f"plots/{p.name}" for p in (staged / "plots").iterdir()} <= uploaded
        for bid, rid in res.build_runs.items():
            local = {str(p.relative_to(staged / "builds" / bid)) for p in (staged / "builds" / bid).rglob("*") if p.is_file()}
            assert local == _files(client, rid)
        for key, rid in res.suite_runs.items():
            bid, suite = key.split("/")
            assert (staged / "items" / bid / f"{suite}.parquet").exists()
            assert {f"items/{suite}.parquet", "items.json"} <= _files(client, rid)
        assert len(res.suite_runs) == 2 * 4 and client.get_run(res.run_id).info.status == "FINISHED"


@pytest.mark.slow
def test_partial_upload_is_superseded_and_failed(wd):
    """Make the artifact store unwritable mid-upload (runs exist, artifacts fail), then replay."""
    make_gate(wd, "g-p", ["fp8kv"], model="other-model")
    blocker = wd / "mlartifacts" / "qverify_other-model"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    with pytest.raises(TrackingError, match="uploading the report"):
        upload_gate(wd, "g-p")
    blocker.unlink()
    res = upload_gate(wd, "g-p")
    assert len(res.superseded) == 1
    with session(resolve(wd)) as client:
        old = client.get_run(res.superseded[0])
        assert old.info.status == "FAILED" and old.data.tags["qverify.superseded"] == "true"
        assert old.data.tags["qverify.superseded_by"] == res.run_id
        assert client.get_run(res.run_id).info.status == "FINISHED"
    assert upload_gate(wd, "g-p").skipped


def test_runs_left_running_by_a_killed_server_are_superseded(wd):
    make_gate(wd, "g-k", ["fp8kv_nvfp4shared"])
    target = resolve(wd)
    with session(target) as client:
        # made here, not left by an earlier test: the test runs alone too (the fast tier leaves the uploads out)
        exp = ensure_experiment(client, "qverify/qverify-tiny", target)
        gate = client.create_run(exp, run_name="gate g-k", tags={"qverify.gate_id": "g-k", "qverify.role": "gate"})
        child = client.create_run(exp, tags={"qverify.gate_id": "g-k", "qverify.role": "build", "qverify.build_id": "x",
                                             "mlflow.parentRunId": gate.info.run_id})
    res = upload_gate(wd, "g-k")
    assert set(res.superseded) == {gate.info.run_id, child.info.run_id}
    with session(resolve(wd)) as client:
        for rid in res.superseded:
            r = client.get_run(rid)
            assert r.info.status == "FAILED" and r.data.tags["qverify.superseded"] == "true"
