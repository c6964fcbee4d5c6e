"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def capacity_cmd() -> None:
    """Plan KV capacity and weight memory for a build on a GPU type."""
    not_implemented('capacity', 'issue 10: capacity')


def register(app: typer.Typer) -> None:
    app.command('capacity', help='Plan KV capacity and weight memory for a build on a GPU type.')(capacity_cmd)
