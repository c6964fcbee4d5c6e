"""Two `qverify report` of one gate at once, as two real processes on one workdir and one sqlite MLflow (#37:
one rebuilt the report folder under the other, and they made two MLflow runs for one gate)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO
from .fixtures import make_gate


def _report(wd: Path, err: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "qverify", "--workdir", str(wd), "--json", "report", "--gate", "g-c"],
                            stdout=subprocess.PIPE, stderr=err.open("w"), text=True, env=env, cwd=wd.parent)


def _until(cond, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


@pytest.mark.slow
def test_two_reports_of_one_gate_make_one_run(tmp_path):
    """The first is frozen (SIGSTOP) once its report is staged, mid-upload; the second starts then. It must wait
    for the first (before: it rebuilt the folder under it and uploaded a second run), then find the gate uploaded."""
    from mlflow import MlflowClient

    wd = tmp_path / ".qverify"
    make_gate(wd, "g-c", ["fp8kv_nvfp4shared"])
    errs = [tmp_path / "first.err", tmp_path / "second.err"]
    first = _report(wd, errs[0])
    html = wd / "gates" / "g-c" / "report" / "report.html"
    assert _until(lambda: html.exists() or first.poll() is not None, 240)
    os.kill(first.pid, signal.SIGSTOP)
    try:
        second = _report(wd, errs[1])
        # the second either waits for the lock (saying so) or, without one, runs to its end while the first is frozen
        _until(lambda: second.poll() is not None or "waiting for it" in errs[1].read_text(), 120)
    finally:
        os.kill(first.pid, signal.SIGCONT)
    outs = [p.communicate(timeout=600)[0] for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [e.read_text()[-2000:] for e in errs]
    res = [json.loads(o) for o in outs]
    assert [r["skipped"] for r in res] == [False, True] and res[0]["run_id"] == res[1]["run_id"], res
    uri = f"sqlite:///{wd / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    runs = client.search_runs([res[0]["experiment_id"]], "tags.`qverify.gate_id` = 'g-c'", max_results=100)
    assert {r.info.status for r in runs} == {"FINISHED"} and not any("qverify.superseded" in r.data.tags for r in runs)
    gate_runs = [r for r in runs if r.data.tags.get("qverify.role") == "gate"]
    assert [r.info.run_id for r in gate_runs] == [res[0]["run_id"]], [(r.info.run_id, r.data.tags) for r in runs]
    assert html.exists()
