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
    NOT_IMPLEMENTED = 5


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


class InfraError(QVerifyError):
    """Something outside the user's input broke: a server, the tracking store, a sandbox."""

    exit_code = ExitCode.INFRA


class NotImplementedYet(QVerifyError):
    exit_code = ExitCode.NOT_IMPLEMENTED
