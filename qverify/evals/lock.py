"""One process at a time: an exclusive fcntl lock per (build, suite) run, and per gate for its report and upload.

Two `qverify eval` (or gates) on the same build and suite would both append every result
(600 lines per replicate for 300 items) and both exit 0; two reports of one gate would rebuild one report folder
under each other and make two MLflow runs for it. flock is released by the kernel when the holder dies, so a
kill -9 never leaves a stale lock; the pid written inside is only for the message, and the file is emptied on
release so a finished run's directory reads the same as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path

from qverify.errors import InfraError


def lock_path(target: Path) -> Path:
    """runs/<build>/.<suite>.lock, gates/.<gate>.lock: beside the folder, so `--fresh` moving it aside (or the
    report rebuilding it) keeps the lock."""
    return target.parent / f".{target.name}.lock"


@contextmanager
def hold_lock(target: Path, when_held: Callable[[str], None]):
    """Hold `target`'s lock. When another process holds it, `when_held(its pid)` runs first: it raises to refuse,
    or returns, and then this waits for the lock."""
    path = lock_path(target)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        yield  # a read-only workdir: nobody can write it, and a reader (a complete eval, a no-op) still can
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            when_held(os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


@contextmanager
def run_lock(run_dir: Path, what: str):
    """Hold `run_dir`'s lock, or exit at once (infrastructure, 3) naming the process that holds it."""

    def refuse(holder: str) -> None:
        raise InfraError(f"{what} is being evaluated by another qverify process (pid {holder})",
                         fix="wait for it to finish and rerun the same command (it resumes, or is a no-op), "
                             "or use another --workdir")

    with hold_lock(run_dir, refuse):
        yield


@contextmanager
def gate_lock(gate_dir: Path, say: Callable[[str], None]):
    """Hold a gate's lock while its report is built and uploaded. A second report of the same gate waits for the
    first (then finds it uploaded and skips): it is the same report, so waiting is what the user wants."""
    with hold_lock(gate_dir, lambda holder: say(f"gate {gate_dir.name} is being reported by pid {holder}; waiting for it")):
        yield
