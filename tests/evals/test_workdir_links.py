"""Files are never followed out of the workdir (#37): results and quarantine are opened without following links,
quarantined lines keep the source's mode, and only regular files inside the workdir are bundled. The real CLI
against a real HTTP server (tests/badserver.py), the real store and the real report bundle."""

from __future__ import annotations

import os
import stat

import pytest

from qverify.errors import BadInput
from qverify.evals.store import RunStore
from qverify.reports.bundle import load_gate
from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir

ARGS = ("--suites", "toolcall", "--limit", "3", "--replicates", "3")


def _run_dir(wd, build):
    return wd / "runs" / build.manifest.build_id / "toolcall"


@pytest.mark.parametrize("replicate", [0, 2])
def test_a_symlinked_results_file_is_refused_and_its_target_untouched(bf16_build, tmp_path, replicate):
    wd = _workdir(bf16_build, tmp_path)
    outside = tmp_path / "precious.txt"
    outside.write_text("precious\n")
    run = _run_dir(wd, bf16_build)
    run.mkdir(parents=True)
    (run / f"r{replicate}.jsonl").symlink_to(outside)
    with BadServer("canned") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, *ARGS)
    assert r.returncode == 4, r.stderr  # was 0: the target was truncated (r0) or appended to (r2)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "is a symlink" in lines[0] and "(fix:" in lines[0], r.stderr
    assert outside.read_text() == "precious\n"


def test_quarantined_lines_keep_the_source_mode(tmp_path):
    store = RunStore(tmp_path / "run")
    with store.writer(0):
        pass
    path = store.replicate_path(0)
    path.write_bytes(b'{"oops\n')
    os.chmod(path, 0o600)
    with store.writer(0) as w:
        assert w.quarantined == 1
    quarantine = path.with_name("r0.quarantine.jsonl")
    assert stat.S_IMODE(quarantine.stat().st_mode) == 0o600  # was 0644: a private file's lines made world-readable
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_symlinked_private_file_is_not_copied_into_quarantine(tmp_path):
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN PRIVATE KEY-----\n")
    os.chmod(secret, 0o600)
    store = RunStore(tmp_path / "run")
    store.dir.mkdir()
    store.replicate_path(1).symlink_to(secret)
    with pytest.raises(BadInput, match="is a symlink"), store.writer(1):
        pass
    assert not list(store.dir.glob("*quarantine*"))
    with pytest.raises(BadInput, match="is a symlink"):
        store.results(1)


def test_only_regular_files_inside_the_workdir_are_bundled(bf16_build, tmp_path):
    from tests.reports.fixtures import make_gate

    wd = tmp_path / "wd"
    make_gate(wd, "g-links", ["fp8kv_nvfp4shared"], reps=1)
    gate = load_gate(wd, "g-links").gate
    build = gate.baseline
    (wd / "logs").mkdir(exist_ok=True)
    (wd / "logs" / f"server-{build}.log").write_text("a real log\n")
    outside = tmp_path / "shadow"
    outside.write_text("root:x:0:0\n")
    (wd / "logs" / f"endpoint-{build}-linked.log").symlink_to(outside)
    logs = load_gate(wd, "g-links").logs[build]
    names = [p.name for p in logs]
    assert f"server-{build}.log" in names and f"endpoint-{build}-linked.log" not in names  # it was bundled


def test_server_logs_are_never_written_through_a_symlink(tmp_path):
    """A server log name is predictable (the build id, a timestamp): a link placed there was appended to."""
    from qverify.serve.base import LaunchedServer

    outside = tmp_path / "authorized_keys"
    outside.write_text("ssh-ed25519 AAAA owner\n")
    log = tmp_path / "logs" / "server-b1.log"
    log.parent.mkdir()
    log.symlink_to(outside)
    with pytest.raises(BadInput, match="is a symlink"):
        LaunchedServer(["/bin/echo", "ssh-ed25519 BBBB attacker"], log).start()
    assert outside.read_text() == "ssh-ed25519 AAAA owner\n"
