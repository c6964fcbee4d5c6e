"""MLflow's first use of a fresh sqlite store, from two processes at once, and a store that cannot be
opened: every tracking error carries the replay command, and two reports never race the store's creation."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .fixtures import make_gate

REPO = Path(__file__).resolve().parents[2]


def _report(wd: Path, gate: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)  # the workdir's own sqlite store, created by these two
    return subprocess.Popen([sys.executable, "-m", "qverify", "--workdir", str(wd), "report", "--gate", gate],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_two_reports_at_once_on_a_fresh_sqlite_store_both_upload(tmp_path):
    wd = tmp_path / "wd"
    make_gate(wd, "g-a", ["fp8kv_nvfp4shared"])
    make_gate(wd, "g-b", ["fp8kv_nvfp4shared"], seed=1)
    assert not (wd / "mlflow.db").exists()
    procs = [_report(wd, g) for g in ("g-a", "g-b")]
    outs = [p.communicate(timeout=600) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err  # before: one exited 3 with "duplicate column name" / "Online migration"


@pytest.mark.slow
def test_a_store_that_cannot_be_opened_prints_the_replay_command(tmp_path):
    wd = tmp_path / "wd"
    make_gate(wd, "g-c", ["fp8kv_nvfp4shared"])
    (wd / "mlflow.db").write_bytes(b"this is not a sqlite database" * 100)
    p = _report(wd, "g-c")
    _, err = p.communicate(timeout=600)
    assert p.returncode == 3, err
    assert f"replay the upload with: qverify --workdir {wd} report --gate g-c" in err, err
    assert "a bug" not in err, err
