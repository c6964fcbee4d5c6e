"""Placeholder until its issue lands: a clear 'not implemented yet' with a non-zero exit."""

from __future__ import annotations

import typer

from qverify.commands._common import not_implemented


def build_cmd() -> None:
    """Build a serving build from a recipe with llm-compressor."""
    not_implemented('build', 'issue 5: qverify build')


def builds_cmd() -> None:
    """List builds in the workdir."""
    not_implemented('builds', 'issue 5: qverify build')


def verify_build_cmd() -> None:
    """Check a build's load integrity and tensor hashes."""
    not_implemented('verify-build', 'issue 5: qverify build')


def register(app: typer.Typer) -> None:
    app.command('build', help='Build a serving build from a recipe with llm-compressor.')(build_cmd)
    app.command('builds', help='List builds in the workdir.')(builds_cmd)
    app.command('verify-build', help="Check a build's load integrity and tensor hashes.")(verify_build_cmd)
