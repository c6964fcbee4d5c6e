"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def serve_cmd() -> None:
    """Serve a build over an OpenAI-compatible API (local, sglang, endpoint)."""
    not_implemented('serve', 'issue 6: qverify serve')


def register(app: typer.Typer) -> None:
    app.command('serve', help='Serve a build over an OpenAI-compatible API (local, sglang, endpoint).')(serve_cmd)
