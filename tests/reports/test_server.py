"""A real `mlflow server` on 127.0.0.1: upload a gate through it, then look at the gate run page in Chromium.

The server runs on a sqlite backend with --artifacts-destination, so artifacts go through
mlflow-artifacts:/ exactly as on a team server. About 11 s and 0.5 GB on an idle machine.
The screenshot is kept for docs/reports.md (docs/img/mlflow_gate_run.png).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from qverify.reports.upload import upload_gate

from .conftest import REPO, chromium, chromium_args
from .fixtures import build_id, make_gate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow-server")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
           "--backend-store-uri", f"sqlite:///{root / 'server.db'}", "--artifacts-destination", str(root / "artifacts")]
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    log = open(root / "server.log", "wb")  # noqa: SIM115 - the server outlives this block; closed in finally
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300  # ~11 s idle; much longer while other jobs load both cores
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "mlflow server did not become healthy"
            time.sleep(1)
        yield url, root
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_upload_through_server_and_screenshot_the_gate_run(server, tmp_path):
    url, root = server
    wd = tmp_path / "wd"
    make_gate(wd, "g-server", ["fp8kv_nvfp4shared", "nvfp4_all"])
    res = upload_gate(wd, "g-server", tracking_uri=url)
    assert not (wd / "mlflow.db").exists()  # everything went to the server

    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=url, registry_uri=url)
    exp = client.get_experiment(res.experiment_id)
    assert exp.artifact_location.startswith("mlflow-artifacts:/")
    assert {"gate.json", "report.html", "report.md"} <= {f.path for f in client.list_artifacts(res.run_id)}
    assert list((root / "artifacts").rglob("report.html"))  # stored by the server, under --artifacts-destination
    mv = client.get_model_version_by_alias("qverify-tiny", "release-candidate")
    assert mv.tags["build_id"] == build_id("fp8kv_nvfp4shared") and mv.tags["gate_run_id"] == res.run_id
    assert upload_gate(wd, "g-server", tracking_uri=url).skipped

    exe = chromium()
    page = f"{url}/#/experiments/{res.experiment_id}/runs/{res.run_id}?workflowType=machine_learning"
    base = chromium_args(exe, tmp_path / "profile") + ["--virtual-time-budget=30000", "--window-size=1440,1000"]
    dom = subprocess.run(base + ["--dump-dom", page], check=True, capture_output=True, text=True, timeout=240).stdout
    assert "gate g-server" in dom and "candidate fp8kv_nvfp4shared" in dom and "Finished" in dom

    out = REPO / "docs" / "img" / "mlflow_gate_run.png"
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(base + [f"--screenshot={out}", page], check=True, capture_output=True, timeout=240)
    assert out.stat().st_size > 50_000
