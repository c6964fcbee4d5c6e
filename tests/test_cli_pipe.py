"""A reader that closes the pipe early (`| head -1`, `| true`) never yields exit 1, the gate's FAIL.

Real shell pipelines (bash, `set -o pipefail` off: PIPESTATUS[0] is qverify's own code). rich's Console and
click each turn a closed pipe into a silent exit 1; the CLI exits 141 (the shell's code for SIGPIPE) instead,
and a gate uploads before it prints, so a piped gate loses neither gate.json nor the MLflow run.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import synth

REPO = Path(__file__).resolve().parents[1]
CLOSED_PIPE = 141


def piped(args: list[str], reader: str, timeout: int = 300, both: bool = False) -> tuple[int, str]:
    """`qverify ARGS | READER` in bash (`2>&1 |` with `both`): qverify's exit code (PIPESTATUS[0]) and its stderr."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("MLFLOW_TRACKING_URI", None)
    cmd = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "qverify", *args])
    # the reader starts before qverify has imported anything, so `true` has exited before the first write
    p = subprocess.run(["bash", "-c", f"{cmd} {'2>&1 ' if both else ''}| {reader} >/dev/null; echo rc=${{PIPESTATUS[0]}} >&2"],
                       stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env, timeout=timeout)
    head, _, rc = p.stderr.rpartition("rc=")
    return int(rc), head


@pytest.mark.parametrize("argv", [["recipes"], ["--json", "recipes"], ["suites", "list"], ["recipes", "--json"]])
def test_a_closed_pipe_is_141_never_1(argv, tmp_path):
    rc, err = piped(["--workdir", str(tmp_path / "wd"), *argv], "true")
    assert rc in (0, CLOSED_PIPE), err  # 0 only if the whole output reached the pipe before `true` exited
    assert "Traceback" not in err and "error:" not in err, err


def test_an_error_keeps_its_exit_code_when_stderr_is_a_closed_pipe(tmp_path):
    """`qverify … 2>&1 | head -1`: the error line may be lost, its exit code (4 here) is not."""
    rc, _ = piped(["--workdir", str(tmp_path / "wd"), "eval", "nosuchbuild"], "true", both=True)
    assert rc == 4


@pytest.fixture
def gate_wd(tmp_path) -> Path:
    wd = tmp_path / ".qverify"
    rng = np.random.default_rng(3)
    p = np.where(rng.random(80) < 0.7, 1.0, 0.0)
    for build in ("base", "cand"):
        synth.write_build(wd / "builds", build, recipe=f"{build}_recipe")
        synth.write_run(wd / "runs", build, "coding",
                        synth.results("coding", synth.item_ids("coding", 80), {"pass@1": synth.bernoulli(p, 3, rng)}))
    return wd


def _uploaded_gate_runs(wd: Path, gate_id: str) -> list:
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{wd / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    return client.search_runs(exps, f"tags.`qverify.gate_id` = '{gate_id}' and tags.`qverify.role` = 'gate'")


@pytest.mark.parametrize("reader", ["head -1", "true"])
def test_a_piped_gate_writes_gate_json_and_uploads_before_it_prints(gate_wd, reader):
    rc, err = piped(["--workdir", str(gate_wd), "gate", "--baseline", "base", "--candidate", "cand",
                     "--suites", "coding", "--fixed"], reader)
    assert rc != 1, err
    new = [g for g in (gate_wd / "gates").glob("*") if g.is_dir()]
    assert len(new) == 1 and (new[0] / "gate.json").is_file(), err
    assert _uploaded_gate_runs(gate_wd, new[0].name), err
