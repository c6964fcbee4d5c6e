"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def recipes_cmd() -> None:
    """List the built-in quantization recipes."""
    not_implemented('recipes', 'issue 5: qverify build')


def register(app: typer.Typer) -> None:
    app.command('recipes', help='List the built-in quantization recipes.')(recipes_cmd)
