"""Exceptions that map to exit codes and a one-line fix.

Every error a user can cause or meet carries the fix in its message, so the CLI
prints one line and exits with the documented code (README, "Exit codes").
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0  # also: gate PASS
    FAIL = 1  # gate FAIL
    INCONCLUSIVE = 2
    INFRA = 3  # server, tracking, sandbox infrastructure
    BAD_INPUT = 4
    CLOSED_PIPE = 141  # stdout's reader went away (`| head -1`): the shell's own code for SIGPIPE, 128 + 13


class QVerifyError(Exception):
    """Base class: `str(err)` is the one-line message, `fix` what to do about it."""

    exit_code: ExitCode = ExitCode.INFRA

    def __init__(self, message: str, fix: str | None = None):
        super().__init__(message)
        self.fix = fix

    def one_line(self) -> str:
        msg = str(self).strip().replace("\n", " ")
        return f"{msg} (fix: {self.fix})" if self.fix else msg


class BadInput(QVerifyError):
    """The user asked for something invalid: unknown name, malformed file, bad flag."""

    exit_code = ExitCode.BAD_INPUT


class ClosedPipe(Exception):
    """Stdout's reader closed the pipe (`qverify gate | head -1`). Not an OSError, so no `except OSError` on the
    way up takes it for a bad path; the CLI exits CLOSED_PIPE (141), never 1, which means a gate FAIL."""


class InfraError(QVerifyError):
    """Something outside the user's input broke: a server, the tracking store, a sandbox."""

    exit_code = ExitCode.INFRA


# errno -> (exit class, what it means, the fix) for OS errors met on the workdir or an input file
_OS_ERRORS = {
    "ENOTDIR": (BadInput, "is not a directory", "pass --workdir pointing at a directory (or a path to create)"),
    "EEXIST": (BadInput, "exists and is not a directory", "pass --workdir pointing at a directory"),
    "EISDIR": (BadInput, "is a directory, not a file", "pass the path of a file"),
    "EROFS": (BadInput, "is on a read-only file system", "pass a writable --workdir (or $QVERIFY_WORKDIR)"),
    "EACCES": (BadInput, "is not writable (permission denied)", "pass a writable --workdir, or fix its permissions"),
    "EPERM": (BadInput, "is not writable (operation not permitted)", "pass a writable --workdir, or fix its permissions"),
    "ENOENT": (BadInput, "does not exist", "check the path"),
    "ENOSPC": (InfraError, "no space left on device", None),
    "EDQUOT": (InfraError, "disk quota exceeded", None),
    "EFBIG": (InfraError, "file too large for the disk or its size limit", None),
}


DISK_FULL = ("ENOSPC", "EDQUOT", "EFBIG")
DISK_FULL_FIX = "free disk space under the workdir, or pass --workdir on a bigger disk; rerun the same command to resume"


def is_disk_full(e: BaseException) -> bool:
    """A full disk (or quota, or file-size limit): the one test, wherever a write can fail."""
    import errno as _errno

    if isinstance(e, OSError) and _errno.errorcode.get(e.errno or 0, "") in DISK_FULL:
        return True
    text = str(e)  # safetensors' Rust writer reports the OS error in its message
    return any(s in text for s in ("No space left", "os error 28", "File too large", "os error 27", "Disk quota"))


def disk_full(message: str, fix: str = DISK_FULL_FIX) -> InfraError:
    """A full disk is infrastructure (exit 3, README "Exit codes"): nothing the user typed was wrong."""
    return InfraError(message, fix=fix)


def from_os_error(e: OSError) -> QVerifyError:
    """An OSError as bad input (the path is wrong) or infrastructure (the disk is full), with the fix."""
    import errno as _errno

    name = _errno.errorcode.get(e.errno or 0, "")
    where = e.filename if e.filename is not None else "a file"
    if name in DISK_FULL:
        return disk_full(f"writing {where}: {_OS_ERRORS[name][1]}")
    kind, what, fix = _OS_ERRORS.get(name, (InfraError, e.strerror or str(e), "check the path and the disk, then rerun"))
    return kind(f"{where} {what}", fix=fix)


def read_input_text(path, what: str, fix: str) -> str:
    """A user-given text file (recipe, config, profile): a directory or binary content is bad input."""
    from pathlib import Path

    p = Path(path)
    if p.is_dir():
        raise BadInput(f"{what} {p} is a directory, not a file", fix=fix)
    refuse_special_files([p], what, fix)
    try:
        return p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise BadInput(f"{what} {p} is not a text file (not UTF-8)", fix=fix) from None


def refuse_special_files(paths, what: str, fix: str) -> None:
    """Bad input if any of `paths` is a FIFO, socket or device: opening one blocks forever (a FIFO waits for a
    writer) or streams without end. Files handed to qverify (configs, recipes, build folders, run folders) pass
    here before they are opened; missing or unreadable ones are left to the read that follows."""
    import stat
    from pathlib import Path

    for p in paths:
        try:
            mode = Path(p).stat().st_mode
        except OSError:
            continue
        if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
            raise BadInput(f"{what} {p} is not a regular file (a FIFO, socket or device)", fix=fix)


# the one fix text for a build or model that needs its own Python (every command that takes a build accepts both)
TRUST_FIX = "read that code, then pass --trust-remote-code or set trust_remote_code = true in qverify.toml"
