"""No bwrap, no untrusted code: the coding suite refuses to run model code outside the sandbox unless asked to.

"bwrap missing" is real here: the CLI runs with a PATH that has no bwrap, prlimit or setpriv, so the
sandbox module's own detection finds none (nothing under test is mocked).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from qverify.evals.store import RunStore
from tests.badserver import BadServer

NO_BWRAP_ENV = {**os.environ, "PATH": "/nonexistent"}


def _eval(wd: Path, build_id: str, url: str, *args: str, env=None):
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", build_id, "--backend",
                           "endpoint", "--endpoint", url, "--suites", "coding", "--limit", "2", "--replicates", "1",
                           *args], capture_output=True, text=True, timeout=300, env=env)


def test_coding_refuses_without_bwrap_unless_allowed(bf16_build, tmp_path):
    wd = tmp_path / "wd"
    (wd / "builds").mkdir(parents=True)
    bid = bf16_build.manifest.build_id
    os.symlink(bf16_build.build_dir, wd / "builds" / bid)
    store = RunStore(wd / "runs" / bid / "coding")
    with BadServer("canned") as srv:
        r = _eval(wd, bid, srv.url, env=NO_BWRAP_ENV)
        assert r.returncode == 3, r.stderr
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "bwrap" in lines[0] and "--allow-unsandboxed" in lines[0], r.stderr
        assert srv.posts == 0 and not store.replicates()  # refused before any model output existed

        r = _eval(wd, bid, srv.url, "--allow-unsandboxed", env=NO_BWRAP_ENV)
        assert r.returncode == 0, r.stderr
        assert "unsandboxed" in r.stderr  # said out loud, once
    m = store.read_manifest()
    assert m.sandbox == "unsandboxed"
    assert all(x.scores["sandboxed"] == 0.0 for x in store.results(0))


def test_the_sandbox_module_refuses_weak_mode_unless_allowed(tmp_path):
    """run_tests itself: the weak fallback only runs when the caller says so (defence in depth)."""
    prog = "print('hi')"
    env = {**NO_BWRAP_ENV, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    code = ("from qverify.suites.sandbox import run_tests, SandboxUnavailable\n"
            "try:\n    run_tests(%r)\nexcept SandboxUnavailable as e:\n    print('refused', e)\n"
            "print(run_tests(%r, allow_unsandboxed=True).passed)\n") % (prog, prog)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0].startswith("refused") and "bwrap" in out[0]
    assert out[-1] == "True"
