"""Two `qverify report` of one gate at once, as two real processes on one workdir and one sqlite MLflow (#37:
one rebuilt the report folder under the other, and they made two MLflow runs for one gate)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .conftest import REPO
from .fixtures import make_gate


def _report(wd: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return subprocess.Popen([sys.executable, "-m", "qverify", "--workdir", str(wd), "--json", "report", "--gate", "g-c"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=wd.parent)


def test_two_reports_of_one_gate_make_one_run(tmp_path):
    from mlflow import MlflowClient

    wd = tmp_path / ".qverify"
    make_gate(wd, "g-c", ["fp8kv_nvfp4shared"])
    first = _report(wd)
    html = wd / "gates" / "g-c" / "report" / "report.html"
    deadline = time.monotonic() + 240
    while not html.exists() and first.poll() is None:  # the first is staged and uploading: start the second now
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = _report(wd)
    outs = [p.communicate(timeout=600) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [e[-2000:] for _, e in outs]
    res = [json.loads(o) for o, _ in outs]
    assert [r["skipped"] for r in res] == [False, True] and res[0]["run_id"] == res[1]["run_id"], res
    uri = f"sqlite:///{wd / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    exp = client.get_experiment(res[0]["experiment_id"])
    runs = client.search_runs([exp.experiment_id], "tags.`qverify.gate_id` = 'g-c'", max_results=100)
    assert {r.info.status for r in runs} == {"FINISHED"} and not any("qverify.superseded" in r.data.tags for r in runs)
    gate_runs = [r for r in runs if r.data.tags.get("qverify.role") == "gate"]
    assert [r.info.run_id for r in gate_runs] == [res[0]["run_id"]], [(r.info.run_id, r.data.tags) for r in runs]
    assert html.exists()
