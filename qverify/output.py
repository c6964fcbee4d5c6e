"""One output sink for human (rich), --json and quiet modes (the hf CLI's pattern)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.table import Table

PLAIN_WIDTH = 80  # a CI log, `| tee`, `| less`: piped output stays within 80 columns (README; the gate's too)


class PipeConsole(Console):
    """rich's Console, except that a closed pipe raises ClosedPipe (exit 141) instead of rich's SystemExit(1):
    1 means a gate FAIL and nothing else (README, "Exit codes")."""

    def on_broken_pipe(self) -> None:
        from qverify.errors import ClosedPipe

        self.quiet = True
        silence_stdout()
        raise ClosedPipe()


def silence_stdout() -> None:
    """Point fd 1 at /dev/null, so that the interpreter's flush at exit meets no closed pipe either
    (Python's note on SIGPIPE: https://docs.python.org/3/library/signal.html#note-on-sigpipe)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


def stdout_is_closed() -> bool:
    """Whether fd 1 is a pipe whose reader has gone (poll reports POLLERR on such a write end)."""
    import select

    try:
        poller = select.poll()
        poller.register(sys.stdout.fileno(), select.POLLOUT)
        return any(ev & select.POLLERR for _, ev in poller.poll(0))
    except (OSError, ValueError):
        return False


def plain_table(title: str, columns: list[str], rows: list[list[Any]], width: int = PLAIN_WIDTH) -> list[str]:
    """A table as plain lines, for output that is not a terminal (where rich cuts cells to "toolc…", "0.575…"):
    per row its first cell, then `column: value` for each other non-empty cell, never split inside a pair."""
    out = [title]
    for row in rows:
        cells = ["" if v is None else str(v) for v in row]
        pieces = [f"{c}: {v}" if c else v for c, v in zip(columns[1:], cells[1:], strict=False) if v]
        line = "  " + cells[0]
        for piece in pieces:
            if len(line) + 2 + len(piece) <= width:
                line += "  " + piece
                continue
            out.append(line)
            wrapped = textwrap.wrap(piece, width - 6, break_on_hyphens=False) or [""]
            out.extend("      " + w for w in wrapped[:-1])
            line = "      " + wrapped[-1]
        out.append(line)
    return out


@dataclass
class Output:
    json_mode: bool = False
    verbose: bool = False
    console: Console = field(default_factory=lambda: PipeConsole(stderr=False))
    err: Console = field(default_factory=lambda: PipeConsole(stderr=True))

    def data(self, obj: Any) -> None:
        """Machine-readable result: printed as JSON with --json, otherwise by the caller's table."""
        if self.json_mode:
            sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.json_mode:
            return
        if not self.console.is_terminal:
            for line in plain_table(title, columns, rows):
                self.console.print(line, highlight=False, markup=False, soft_wrap=True)
            return
        t = Table(title=title)
        for c in columns:
            t.add_column(c)
        for r in rows:
            t.add_row(*[("" if v is None else str(v)) for v in r])
        self.console.print(t)

    def bullets(self, title: str, items: list[str]) -> None:
        """A titled list, each item wrapped under its own bullet (a hanging indent), so a wrapped line never reads
        as a bullet of its own; at the terminal's width, else PLAIN_WIDTH."""
        if self.json_mode:
            return
        width = self.console.width if self.console.is_terminal else PLAIN_WIDTH
        self.console.print(title, highlight=False, markup=False)
        for item in items:
            lines = textwrap.wrap(item, width - 4, break_on_hyphens=False) or [""]
            self.console.print("  - " + "\n    ".join(lines), highlight=False, markup=False, soft_wrap=True)

    def info(self, msg: str) -> None:
        if not self.json_mode:
            self.err.print(msg, soft_wrap=True)  # one message, one line: piped, rich would cut it at 80

    def warn(self, msg: str) -> None:
        self.err.print(f"[yellow]warning:[/yellow] {msg}", soft_wrap=True)

    @contextmanager
    def stdout_is_data(self) -> Iterator[None]:
        """In --json mode, send everything written to stdout inside the block to stderr instead.

        Libraries log to stdout behind our back (llm-compressor's loguru sink, progress bars,
        the server's subprocess output); at file-descriptor level so that none of it can break
        the one JSON document --json promises on stdout.
        """
        if not self.json_mode:
            yield
            return
        sys.stdout.flush()
        saved = os.dup(1)
        os.dup2(2, 1)
        try:
            yield
        finally:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)

    def error(self, msg: str) -> None:
        self.err.print(f"[red]error:[/red] {msg}", highlight=False, soft_wrap=True)
