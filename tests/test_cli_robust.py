"""Exit codes by cause under bad input and a broken workdir; numbers validated at the boundary.

Never exit 1 (the gate's FAIL) for anything else. Read-only and full workdirs are real: the CLI runs
under bwrap with the workdir bind-mounted read-only, or with a full tmpfs on it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qverify.cli import app, main

REPO = Path(__file__).resolve().parents[1]


def run(*args, cwd=None, prefix=()):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([*prefix, sys.executable, "-m", "qverify", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120, env=env)


def one_error_line(r) -> str:
    """The one `error:` line, last on stderr. Indented lines before it are progress (`  resolve …`: a build prints its
    stages as lines when stderr is not a terminal, as in CI)."""
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("  ")]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr
    assert r.stderr.rstrip().splitlines()[-1] == lines[0], r.stderr
    assert "Traceback" not in r.stderr
    return lines[0]


# ---------------------------------------------------------------- numbers, at the boundary

# `qverify eval b OPTION VALUE`: each value refused. nan passes every comparison and inf is no time: refused where
# numbers are read (#31); a billion items or replicates planned memory before the first request, then hung (#31).
EVAL_BAD = {"--concurrency": ("0", "-1"), "--limit": ("0", "-3", "1000000000"), "--replicates": ("0", "1000000000"),
            "--error-budget": ("7", "0.5", "-0.1", "nan"), "--read-timeout": ("0", "inf"), "--connect-timeout": ("-1",),
            "--item-timeout": ("0", "nan", "inf"), "--port": ("70000",)}
OTHER_BAD = [(["gate", "--budget", "0"], "--budget"), (["gate", "--budget", "ten minutes"], "--budget"),
             (["serve", "b", "--ready-timeout", "0"], "--ready-timeout"), (["suites", "show", "coding", "--n", "0"], "--n"),
             (["capacity", "b", "--tp", "0"], "--tp"), (["capacity", "b", "--mem-fraction", "1.5"], "--mem-fraction"),
             (["build", "--recipe", "bf16", "--calib-samples", "0"], "--calib-samples")]


def in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    """The CLI's main() in this process (a subprocess per case cost a second of imports each)."""
    code = main(argv)
    return subprocess.CompletedProcess(argv, code, "", capsys.readouterr().err)


@pytest.mark.parametrize("argv, names", [(["eval", "b", opt, v], opt) for opt, vs in EVAL_BAD.items() for v in vs]
                         + OTHER_BAD)
def test_numeric_options_are_validated_with_a_fix(argv, names, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    r = in_process(["--workdir", str(tmp_path / "wd"), *argv], capsys)
    assert r.returncode == 4, r.stderr
    line = one_error_line(r)
    assert names in line and "fix:" in line
    assert "--fresh" not in line  # a bad number never suggests moving good results aside
    assert not (tmp_path / "wd").exists()  # nothing touched


@pytest.mark.parametrize("toml, key", [
    ("replicates = 0", "replicates"),
    ("limit = 0", "limit"),
    ("error_budget = 0.5", "error_budget"),
    ("alpha = 0", "alpha"),
    ("alpha = 1.5", "alpha"),
    ("[serving]\nconcurrency = 0", "serving.concurrency"),
    ("[client]\nread_timeout_s = 0", "client.read_timeout_s"),
    ("[client]\nitem_timeout_s = -5", "client.item_timeout_s"),
    ('[thresholds."coding/pass@1"]\ntolerance = -0.1', "tolerance"),
    ('budget = "ten minutes"', "budget"),
    ('budget = "0"', "budget"),
    ("looks = 0", "looks"),
    ("error_budget = nan", "error_budget"),
    ("[client]\nitem_timeout_s = inf", "client.item_timeout_s"),
    ("noise_k = inf", "noise_k"),
    ("replicates = 1000000000", "replicates"),
    ("limit = 1000000000", "limit"),
])
def test_config_values_are_validated_with_a_fix(toml, key, tmp_path, monkeypatch, capsys):
    (tmp_path / "q.toml").write_text(toml + "\n")
    monkeypatch.chdir(tmp_path)
    r = in_process(["--workdir", str(tmp_path / "wd"), "gate", "--config", str(tmp_path / "q.toml")], capsys)
    assert r.returncode == 4, r.stderr
    line = one_error_line(r)
    assert key in line and "fix:" in line


# ---------------------------------------------------------------- files that are not what they claim

def test_binary_recipe_config_and_a_directory_as_config_are_bad_input(tmp_path):
    blob = tmp_path / "blob.yaml"
    blob.write_bytes(bytes(range(256)) * 4)
    for argv in (["build", "--recipe", str(blob)], ["gate", "--config", str(blob)], ["gate", "--config", str(tmp_path)]):
        r = run("--workdir", str(tmp_path / "wd"), *argv, cwd=tmp_path)
        assert r.returncode == 4, (argv, r.stderr)
        assert "fix:" in one_error_line(r)


def test_a_config_that_is_a_fifo_is_bad_input_at_once(tmp_path):
    fifo = tmp_path / "q.toml"
    os.mkfifo(fifo)  # nothing ever writes to it: reading it would block forever
    r = run("--workdir", str(tmp_path / "wd"), "gate", "--config", str(fifo), cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    assert "not a regular file" in one_error_line(r)
    r = run("--workdir", str(tmp_path / "wd"), "build", "--recipe", str(fifo), cwd=tmp_path)
    assert r.returncode == 4, r.stderr  # a recipe path that is no file is "not found" before anything opens it


# ---------------------------------------------------------------- the workdir itself

@pytest.fixture(scope="module")
def gated_wd(tmp_path_factory) -> Path:
    """A workdir with two small synthetic runs, ready to gate."""
    from tests import synth

    wd = tmp_path_factory.mktemp("robust") / "wd"
    rng = np.random.default_rng(0)
    for b in ("base", "cand"):
        synth.write_build(wd / "builds", b, recipe=b)
        synth.write_run(wd / "runs", b, "coding",
                        synth.results("coding", synth.item_ids("coding", 40), {"pass@1": synth.bernoulli(np.full(40, .7), 3, rng)}))
    return wd


GATE = ("gate", "--no-report", "--fixed", "--baseline", "base", "--candidate", "cand", "--suites", "coding")


def test_workdir_that_is_a_file_is_bad_input(tmp_path):
    f = tmp_path / "wd"
    f.write_text("not a directory")
    for argv in (["eval", "x", "--suites", "toolcall"], ["build", "--recipe", "bf16"], list(GATE)):
        r = run("--workdir", str(f), *argv, cwd=tmp_path)
        assert r.returncode == 4, (argv, r.stderr)
        line = one_error_line(r)
        assert str(f) in line and "not a directory" in line and "--workdir" in line


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap to mount the workdir read-only")
def test_read_only_workdir_is_bad_input_with_a_fix(gated_wd):
    ro = ("bwrap", "--dev-bind", "/", "/", "--ro-bind", str(gated_wd), str(gated_wd), "--")
    r = run("--workdir", str(gated_wd), *GATE, prefix=ro)
    assert r.returncode == 4, r.stderr
    line = one_error_line(r)
    assert "read-only" in line and str(gated_wd) in line and "fix:" in line


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bwrap to mount a small tmpfs")
def test_full_disk_under_the_workdir_is_infrastructure_with_a_fix(gated_wd):
    gates = gated_wd / "gates"
    gates.mkdir(exist_ok=True)
    full = ("bwrap", "--dev-bind", "/", "/", "--size", "65536", "--tmpfs", str(gates), "--",
            "sh", "-c", f'head -c 65536 /dev/zero > {gates}/filler 2>/dev/null; exec "$@"', "sh")
    r = run("--workdir", str(gated_wd), *GATE, prefix=full)
    assert r.returncode == 3, r.stderr
    line = one_error_line(r)
    assert "no space left" in line.lower() and "fix:" in line


@pytest.mark.parametrize("fifo", ["runs/cand/coding/manifest.json", "runs/cand/coding/r0.jsonl",
                                  "builds/cand/config.json", "builds/cand/build.json"])
def test_a_fifo_in_a_run_or_build_folder_is_bad_input_at_once(gated_wd, tmp_path, fifo):
    """Opening a FIFO waits for a writer forever: a run or build folder someone hands you could stall CI (the
    hostile pass: `gate` and `verify-build` hung until killed). Refused before anything opens it."""
    wd = tmp_path / "wd"
    shutil.copytree(gated_wd, wd)
    target = wd / fifo
    target.unlink(missing_ok=True)
    os.mkfifo(target)
    r = run("--workdir", str(wd), *GATE, cwd=tmp_path)
    assert r.returncode == 4, r.stderr
    line = one_error_line(r)
    assert "not a regular file" in line and target.name in line


# ---------------------------------------------------------------- the catch-all

def test_an_unexpected_error_is_exit_3_with_one_line_and_a_crash_log(tmp_path, capsys):
    """A bug surfaces as infrastructure (3), one line pointing at -v and a crash log, never a traceback or 1."""

    def boom() -> None:
        raise ZeroDivisionError("a bug in qverify")

    app.command("boom-for-test")(boom)  # a command that fails the way a bug would (test-only)
    try:
        code = main(["--workdir", str(tmp_path / "wd"), "boom-for-test"])
        err = capsys.readouterr().err
        assert code == 3
        line = one_error_line(type("R", (), {"stderr": err}))
        assert "ZeroDivisionError" in line and "-v" in line
        logs = list((tmp_path / "wd" / "logs").glob("crash-*.txt"))
        assert len(logs) == 1 and str(logs[0]) in line
        assert "Traceback" in logs[0].read_text() and "a bug in qverify" in logs[0].read_text()
        assert main(["-v", "--workdir", str(tmp_path / "wd"), "boom-for-test"]) == 3
        assert "Traceback" in capsys.readouterr().err  # -v shows it
    finally:
        app.registered_commands.pop()
