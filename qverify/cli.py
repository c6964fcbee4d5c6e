"""The `qverify` command: a thin typer root that wires subcommands (each in qverify/commands/).

Errors become one line and a documented exit code (README, "Exit codes"); the full
traceback shows only with -v. Exit 1 means a gate FAIL and nothing else: OS errors are
bad input (4, the path is wrong) or infrastructure (3, the disk is full), and anything
unexpected is infrastructure (3) with a crash log under <workdir>/logs/.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated

import typer

try:  # typer >= 0.20 vendors click as typer._click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover
    from click import exceptions as click_exc

from qverify import __version__
from qverify.commands._common import JsonOpt
from qverify.errors import BadInput, ClosedPipe, ExitCode, QVerifyError, from_os_error
from qverify.scrub import scrub_text

_workdir = None  # the Workdir, set by the root callback: where a crash log goes

app = typer.Typer(
    name="qverify",
    help="Verify lossy LLM serving builds (FP8 KV, NVFP4 experts, FP8 drafters) against run-to-run noise.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


class AppState:
    def __init__(self, workdir: Path, verbose: bool, json_mode: bool):
        from qverify.output import Output
        from qverify.workdir import Workdir

        self.workdir = Workdir.at(workdir)
        global _workdir
        _workdir = self.workdir
        if self.workdir.root.exists() and not self.workdir.root.is_dir():
            raise BadInput(f"workdir {self.workdir.root} is not a directory",
                           fix="pass --workdir pointing at a directory (or a path to create), or set $QVERIFY_WORKDIR")
        self.verbose = verbose
        self.out = Output(json_mode=json_mode, verbose=verbose)
        from qverify.logs import route_library_logs

        route_library_logs(self.workdir.logs, verbose)


def _version(value: bool) -> None:
    if value:
        print(f"qverify {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    workdir: Annotated[Path, typer.Option("--workdir", envvar="QVERIFY_WORKDIR", help="where builds, runs, gates live")] = Path(".qverify"),
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="debug output and full tracebacks")] = False,
    json_mode: JsonOpt = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")] = False,
) -> None:
    ctx.obj = AppState(workdir, verbose, json_mode)


def _register() -> None:
    from qverify.commands import build, capacity, evaluate, gate, recipes, report, serve, suites

    for mod in (recipes, build, serve, suites, evaluate, gate, report, capacity):
        mod.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    from qverify import interrupt

    previous = interrupt.install()
    try:
        rv = _main(argv)
    except KeyboardInterrupt:  # a second Ctrl-C while the first one unwinds
        rv = 130
    finally:
        interrupt.restore(previous)
    signum = interrupt.received()
    if signum is not None:
        # whatever the unwinding raised on the way out, the cause is the signal: say so once, and how to resume
        _say(f"error: {interrupt.resume_line(signum, list(argv if argv is not None else sys.argv[1:]))}")
        rv = interrupt.exit_code(signum)
    return _exit(rv)


def _main(argv: list[str] | None) -> int:
    verbose = "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv)
    try:
        rv = app(args=_json_first(list(argv if argv is not None else sys.argv[1:])), prog_name="qverify",
                 standalone_mode=False)
    except click_exc.UsageError as e:
        msg = e.format_message().splitlines()[0] if e.format_message() else "bad usage"
        _say(f"error: {msg} (fix: see 'qverify --help')")
        return ExitCode.BAD_INPUT
    except (KeyboardInterrupt, getattr(click_exc, "Abort", KeyboardInterrupt)):
        return 130
    except ClosedPipe:  # rich met the closed pipe (qverify.output.PipeConsole); silent, as the shell is
        return ExitCode.CLOSED_PIPE
    except SystemExit as e:
        # click turns any EPIPE into a silent sys.exit(1), the FAIL verdict's code: take back the error it replaced
        cause = e.__context__
        if isinstance(cause, OSError) and cause.errno == errno.EPIPE:
            return _failed(cause, verbose)
        raise
    except Exception as e:  # noqa: BLE001 -- a bug: infrastructure (3), never read as a FAIL verdict (Python's 1)
        return _failed(e, verbose)
    return _flushed(rv if isinstance(rv, int) else 0)


def _json_first(argv: list[str]) -> list[str]:
    """`--json` anywhere before `--` (`qverify gate ... --json`): moved to the root, where it is declared once, so
    that it works before or after every command."""
    end = argv.index("--") if "--" in argv else len(argv)
    rest = [a for a in argv[:end] if a != "--json"]
    return argv if len(rest) == end else ["--json", *rest, *argv[end:]]


def _failed(e: Exception, verbose: bool) -> int:
    from qverify.interrupt import STOP
    from qverify.output import silence_stdout, stdout_is_closed

    if STOP.is_set():  # raised while a signal unwinds (a server stopped, a call cancelled): main() says why
        return 130
    if isinstance(e, QVerifyError):
        return _report(e, verbose)
    if isinstance(e, BrokenPipeError) and stdout_is_closed():  # a plain write to stdout met `| head -1`
        silence_stdout()
        return ExitCode.CLOSED_PIPE
    if isinstance(e, OSError):  # a path that is not what it should be, a full disk, a peer gone (EPIPE: 3)
        return _report(from_os_error(e), verbose)
    return _crash(e, verbose)


def _flushed(rv: int) -> int:
    """Flush stdout now: at the interpreter's exit a closed pipe would print a traceback and exit 120."""
    from qverify.output import silence_stdout

    try:
        sys.stdout.flush()
    except BrokenPipeError:
        silence_stdout()
        return ExitCode.CLOSED_PIPE
    return rv


def _say(text: str, end: str = "\n") -> None:
    """An error line on stderr. If stderr's reader has gone (`2>&1 | head -1`) the line is lost, never the error's
    exit code: fd 2 then points at /dev/null, so that the interpreter's flush at exit fails neither."""
    try:
        print(text, file=sys.stderr, end=end, flush=True)
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)


def _report(e: QVerifyError, verbose: bool) -> int:
    if verbose:
        traceback.print_exc()
    # a multi-line message is a server log tail: keep its line breaks readable
    msg = f"{e}\n(fix: {e.fix})" if "\n" in str(e).strip() and e.fix else e.one_line()
    _say(f"error: {scrub_text(msg)}")
    return e.exit_code


def _crash(e: Exception, verbose: bool) -> int:
    """One line naming the error, the crash log that holds the traceback, and -v."""
    import tempfile
    import time

    text = "".join(traceback.format_exception(e))
    if verbose:
        _say(text, end="")
    name = f"crash-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.txt"
    where = None
    for d in ([_workdir.logs] if _workdir else []) + [Path(tempfile.gettempdir())]:
        try:
            d.mkdir(parents=True, exist_ok=True)
            (d / name).write_text(scrub_text(f"qverify {__version__}\nargv: {sys.argv}\n\n{text}"))
            where = d / name
            break
        except OSError:
            continue
    first = scrub_text((str(e).strip().splitlines() or [""])[0][:200])
    log = f"; traceback in {where}" if where else ""
    _say(f"error: unexpected {type(e).__name__}: {first} (fix: a bug in qverify{log}; rerun with -v to see it, "
         f"and report it)")
    return int(ExitCode.INFRA)


def _exit(code: int) -> int:
    if __name__ == "__main__" or sys.argv[0].endswith("qverify"):
        sys.exit(int(code))
    return int(code)


if __name__ == "__main__":
    main()
