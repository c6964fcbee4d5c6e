"""The `qverify` command: a thin typer root that wires subcommands (each in qverify/commands/).

Errors become one line and a documented exit code (README, "Exit codes"); the full
traceback shows only with -v.
"""

from __future__ import annotations

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
from qverify.errors import ExitCode, InfraError, QVerifyError

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
        self.verbose = verbose
        self.out = Output(json_mode=json_mode, verbose=verbose)


def _version(value: bool) -> None:
    if value:
        print(f"qverify {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    workdir: Annotated[Path, typer.Option("--workdir", envvar="QVERIFY_WORKDIR", help="where builds, runs, gates live")] = Path(".qverify"),
    verbose: Annotated[bool, typer.Option("-v", "--verbose", help="debug output and full tracebacks")] = False,
    json_mode: Annotated[bool, typer.Option("--json", help="machine-readable output")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True, help="print the version")] = False,
) -> None:
    ctx.obj = AppState(workdir, verbose, json_mode)


def _register() -> None:
    from qverify.commands import build, capacity, evaluate, gate, recipes, report, serve, suites

    for mod in (recipes, build, serve, suites, evaluate, gate, report, capacity):
        mod.register(app)


_register()


def main(argv: list[str] | None = None) -> int:
    verbose = "-v" in (argv or sys.argv) or "--verbose" in (argv or sys.argv)
    try:
        rv = app(args=argv, prog_name="qverify", standalone_mode=False)
    except click_exc.UsageError as e:
        msg = e.format_message().splitlines()[0] if e.format_message() else "bad usage"
        print(f"error: {msg} (fix: see 'qverify --help')", file=sys.stderr)
        return _exit(ExitCode.BAD_INPUT)
    except QVerifyError as e:
        if verbose:
            traceback.print_exc()
        # infrastructure errors carry a server log tail: keep its line breaks readable
        msg = f"{e}\n(fix: {e.fix})" if isinstance(e, InfraError) and e.fix else (str(e) if isinstance(e, InfraError) else e.one_line())
        print(f"error: {msg}", file=sys.stderr)
        return _exit(e.exit_code)
    except (KeyboardInterrupt, getattr(click_exc, "Abort", KeyboardInterrupt)):
        return _exit(130)
    except Exception as e:  # noqa: BLE001 -- unexpected: an infrastructure failure (3), never read as a FAIL verdict (Python's 1)
        if verbose:
            traceback.print_exc()
        first = str(e).strip().splitlines()[0][:300] if str(e).strip() else ""
        print(f"error: unexpected {type(e).__name__}: {first} (fix: rerun with -v for the traceback, and report it)",
              file=sys.stderr)
        return _exit(ExitCode.INFRA)
    return _exit(rv if isinstance(rv, int) else 0)


def _exit(code: int) -> int:
    if __name__ == "__main__" or sys.argv[0].endswith("qverify"):
        sys.exit(int(code))
    return int(code)


if __name__ == "__main__":
    main()
