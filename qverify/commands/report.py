"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def report_cmd() -> None:
    """Upload a gate to MLflow and write the release-review report."""
    not_implemented('report', 'issue 9: release review')


def register(app: typer.Typer) -> None:
    app.command('report', help='Upload a gate to MLflow and write the release-review report.')(report_cmd)
