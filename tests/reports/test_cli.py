"""`qverify report` through the real CLI entry point: exit codes, --json, --compare."""

from __future__ import annotations

import json
import socket

import pytest

from qverify.cli import main


def test_bad_usage_is_exit_4(workdir, capsys):
    assert main(["--workdir", str(workdir), "report"]) == 4
    assert main(["--workdir", str(workdir), "report", "--gate", "g-main", "--compare"]) == 4
    assert main(["--workdir", str(workdir), "report", "--gate", "g-main", "--baseline", "x"]) == 4
    assert main(["--workdir", str(workdir), "report", "--gate", "no-such-gate"]) == 4
    err = capsys.readouterr().err
    assert "no gate 'no-such-gate'" in err and "known gates: g-main" in err


def test_gate_upload_json(workdir, uploaded, capsys):
    assert main(["--workdir", str(workdir), "--json", "report", "--gate", "g-main"]) == 0
    data = json.loads(capsys.readouterr().out)  # nothing but JSON on stdout (MLflow's run URLs are suppressed)
    assert data["skipped"] is True and data["run_id"] == uploaded.run_id and data["verdict"] == "FAIL"


def test_compare_json(workdir, uploaded, capsys):
    assert main(["--workdir", str(workdir), "--json", "report", "--compare", "--baseline", "bf16"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["rank"] == 1 and rows[0]["recipe"] == "fp8kv_nvfp4shared" and rows[-1]["verdict"] == "FAIL"


@pytest.mark.slow
def test_dead_server_is_exit_3_with_replay(workdir, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["--workdir", str(workdir), "report", "--gate", "g-main", "--tracking-uri", f"http://127.0.0.1:{port}"]) == 3
    err = capsys.readouterr().err
    assert f"replay the upload with: qverify --workdir {workdir} report --gate g-main --tracking-uri http://127.0.0.1:{port}" in err
