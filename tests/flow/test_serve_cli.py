"""`qverify serve`'s help and dry run (issue 40.6): the help lists every built-in profile (before: 3 of 5, not the
kimi-k2.6 ones the docs recommend), and a dry run prints the same command each time (before: a random port)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from qverify.serve.profile import builtin_profiles

ROOT = Path(__file__).resolve().parents[2]


def _qv(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qverify", *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env={"COLUMNS": "300", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}, check=False)


def test_serve_help_lists_every_builtin_profile():
    r = _qv("serve", "--help")
    assert r.returncode == 0 and all(name in r.stdout for name in builtin_profiles().names())


def test_a_dry_run_is_the_same_command_each_time(tmp_path):
    from tests import synth

    d = synth.write_build(tmp_path / "wd" / "builds", "b1", recipe="bf16")
    (d / "config.json").write_text("{}")
    runs = [_qv("--workdir", str(tmp_path / "wd"), "serve", "b1", "--backend", "sglang", "--dry-run", cwd=tmp_path)
            for _ in range(2)]
    assert runs[0].returncode == 0, runs[0].stderr
    assert runs[0].stdout == runs[1].stdout and "--port 30000" in runs[0].stdout
