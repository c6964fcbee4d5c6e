"""Ctrl-C (SIGINT) and SIGTERM stop a command within seconds and leave a resumable workdir.

Python raises KeyboardInterrupt only in the main thread; `gate --recipe` evaluates builds on
worker threads, which ran both evals to completion before exiting 130. So the handler also sets
STOP, which every eval loop watches (qverify.evals.runner), and SIGTERM gets the same treatment
instead of Python's default (death without a word, the writers' buffers unflushed).
"""

from __future__ import annotations

import signal
import threading

from qverify.scrub import masked_command

STOP = threading.Event()
_received: list[int] = []  # the signals seen: typer turns any KeyboardInterrupt into a bare exit 130


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so every `finally` (writers, servers) runs; exit 143 instead of 130."""


def received() -> int | None:
    """The first stopping signal this command received, if any."""
    return _received[0] if _received else None


def exit_code(signum: int) -> int:
    return 128 + signum


def resume_line(signum: int, argv: list[str]) -> str:
    """The one line printed on the way out: what stopped, and the command that resumes."""
    what = "terminated (SIGTERM)" if signum == signal.SIGTERM else "interrupted (Ctrl-C)"
    # the password stays masked: the user puts it back (docs/security.md: messages never show it)
    return (f"{what}: every result written so far is kept; resume with `qverify {masked_command(argv)}` "
            "(it continues where this stopped)")


def _handler(signum, frame):
    _received.append(signum)
    STOP.set()
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def install() -> dict:
    """Our handlers for SIGINT and SIGTERM (main thread only); returns the previous ones for `restore`."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    STOP.clear()
    _received.clear()
    return {s: signal.signal(s, _handler) for s in (signal.SIGINT, signal.SIGTERM)}


def restore(previous: dict) -> None:
    for s, h in previous.items():
        signal.signal(s, h)
