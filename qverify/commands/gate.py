"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def gate_cmd() -> None:
    """Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise."""
    not_implemented('gate', 'issue 8: qverify gate')


def register(app: typer.Typer) -> None:
    app.command('gate', help='Decide PASS / FAIL / INCONCLUSIVE against run-to-run noise.')(gate_cmd)
