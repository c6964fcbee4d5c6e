"""One process owns a run: an exclusive fcntl lock per (build, suite) while it is evaluated.

Two `qverify eval` (or gates) on the same build and suite would both append every result
(600 lines per replicate for 300 items) and both exit 0. flock is released by the kernel when
the holder dies, so a kill -9 never leaves a stale lock; the pid written inside is only for the
message, and the file is emptied on release so a finished run's directory reads the same as before.
"""

from __future__ import annotations

import errno
import fcntl
import os
from contextlib import contextmanager
from pathlib import Path

from qverify.errors import InfraError


def lock_path(run_dir: Path) -> Path:
    """runs/<build>/.<suite>.lock: beside the run dir, so `--fresh` moving the dir aside keeps the lock."""
    return run_dir.parent / f".{run_dir.name}.lock"


@contextmanager
def run_lock(run_dir: Path, what: str):
    """Hold `run_dir`'s lock, or exit at once (infrastructure, 3) naming the process that holds it."""
    path = lock_path(run_dir)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno != errno.EROFS:
            raise
        yield  # a read-only workdir: nobody can write this run, and a complete eval (a no-op) still reads it
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
            raise InfraError(f"{what} is being evaluated by another qverify process (pid {holder})",
                             fix="wait for it to finish and rerun the same command (it resumes, or is a no-op), "
                                 "or use another --workdir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
