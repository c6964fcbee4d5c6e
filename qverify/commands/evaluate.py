"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def eval_cmd() -> None:
    """Run suites with replicates against a served build."""
    not_implemented('eval', 'issue 7: qverify eval')


def register(app: typer.Typer) -> None:
    app.command('eval', help='Run suites with replicates against a served build.')(eval_cmd)
