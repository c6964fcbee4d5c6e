"""Runs that survive damage, a second process and signals: the real CLI in subprocesses against
real local HTTP servers (tests/badserver.py), checked on what lands on disk."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from qverify.evals.store import RunStore, atomic_write_text
from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir


def _run_dir(wd: Path, build) -> Path:
    return wd / "runs" / build.manifest.build_id / "toolcall"


def test_a_damaged_middle_line_is_quarantined_and_the_results_after_it_kept(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    args = ("--suites", "toolcall", "--limit", "6", "--replicates", "1")
    with BadServer("canned") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, *args)
        assert r.returncode == 0, r.stderr
        path = _run_dir(wd, bf16_build) / "r0.jsonl"
        lines = path.read_bytes().splitlines(keepends=True)
        assert len(lines) == 6
        damaged = lines[:2] + [b'{"item_id": "x", "oops\n'] + lines[3:]
        path.write_bytes(b"".join(damaged))
        assert len(RunStore(path.parent).results(0)) == 5  # reading skips the bad line, keeps what follows
        r, _ = _eval(wd, bf16_build, srv.url, *args)
    assert r.returncode == 0, r.stderr
    assert "quarantine" in r.stderr, r.stderr  # one warning says what happened
    after = path.read_bytes().splitlines(keepends=True)
    assert after[:5] == lines[:2] + lines[3:]  # the 3 results after the bad line are the same bytes, not re-sampled
    assert len(after) == 6 and len(RunStore(path.parent).results(0)) == 6  # only the damaged item ran again
    assert (path.parent / "r0.quarantine.jsonl").read_bytes() == b'{"item_id": "x", "oops\n'


def test_a_corrupt_run_manifest_is_bad_input_naming_the_file_and_the_fix(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    m = _run_dir(wd, bf16_build) / "manifest.json"
    m.parent.mkdir(parents=True)
    m.write_text('{"build_id": ')
    with BadServer("canned") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", "2", "--replicates", "1")
    assert r.returncode == 4, r.stderr
    assert str(m) in r.stderr and "delete it" in r.stderr and "a bug" not in r.stderr, r.stderr


def test_a_second_process_on_the_same_run_exits_at_once_and_the_first_writes_each_result_once(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    args = ["--suites", "toolcall", "--limit", "4", "--replicates", "1"]
    with BadServer("hang", hang_s=4) as slow, BadServer("canned") as fast:
        cmd = [sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", bf16_build.manifest.build_id,
               "--backend", "endpoint", "--endpoint", slow.url, *args]
        first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while slow.posts == 0 and time.monotonic() < deadline:  # the first owns the run and is waiting on answers
            time.sleep(0.1)
        r, secs = _eval(wd, bf16_build, fast.url, *args)
        out, err = first.communicate(timeout=300)
    assert r.returncode == 3 and "being evaluated by another qverify process" in r.stderr, r.stderr
    assert str(first.pid) in r.stderr and fast.posts == 0, r.stderr
    assert first.returncode == 0, err
    assert len((_run_dir(wd, bf16_build) / "r0.jsonl").read_bytes().splitlines()) == 4  # not 8


def test_temp_files_have_unique_names_so_concurrent_writers_never_collide(tmp_path):
    target, errors = tmp_path / "manifest.json", []

    def write(tag: str) -> None:
        try:
            for i in range(300):
                atomic_write_text(target, f"{tag} {i}\n" * 50)
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:1]
    assert len(set(target.read_text().splitlines())) == 1  # one writer's whole text, never a mix
    assert [p.name for p in tmp_path.iterdir()] == ["manifest.json"]  # no temp file left behind
    umask = os.umask(0)
    os.umask(umask)
    assert target.stat().st_mode & 0o777 == 0o666 & ~umask  # as open() makes it: readable by others as before


HANG_S = 60  # how long the server sits on each request


def _interrupt(bf16_build, tmp_path, sig: int) -> tuple[int, str, float, Path]:
    wd = _workdir(bf16_build, tmp_path)
    args = ["--suites", "toolcall", "--limit", "4", "--replicates", "1"]
    with BadServer("hang", hang_s=HANG_S) as srv:
        cmd = [sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", bf16_build.manifest.build_id,
               "--backend", "endpoint", "--endpoint", srv.url, *args]
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while srv.posts < 4 and time.monotonic() < deadline:
            time.sleep(0.1)
        t0 = time.monotonic()
        os.kill(p.pid, sig)
        try:
            _, err = p.communicate(timeout=30)
        finally:
            p.kill()
        secs = time.monotonic() - t0
    return p.returncode, err, secs, wd


def test_sigterm_and_ctrl_c_stop_in_seconds_with_one_line_saying_how_to_resume(bf16_build, tmp_path):
    for sig, code in ((signal.SIGTERM, 143), (signal.SIGINT, 130)):
        rc, err, secs, wd = _interrupt(bf16_build, tmp_path / sig.name, sig)
        lines = [ln for ln in err.splitlines() if ln.strip()]
        # well before the hanging answers would come: a signal that waited for them fails (no absolute wall time)
        assert rc == code and secs < HANG_S / 3, (sig, rc, secs, err)
        assert len(lines) == 1 and "resume with `qverify --workdir" in lines[0], err
        assert "Traceback" not in err and "a bug" not in err
        # resumable: the same command against a server that answers finishes the run
        with BadServer("canned") as srv:
            r, _ = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", "4", "--replicates", "1")
        assert r.returncode == 0, r.stderr
        assert len(RunStore(_run_dir(wd, bf16_build)).results(0)) == 4
