"""Shared option aliases and helpers for commands."""

from __future__ import annotations

from typing import Annotated

import typer

from qverify.errors import NotImplementedYet

ConfigOpt = Annotated[str | None, typer.Option("--config", help="qverify.toml to read (default ./qverify.toml)")]


def state(ctx: typer.Context):
    return ctx.obj


def not_implemented(what: str, issue: str) -> None:
    raise NotImplementedYet(f"'{what}' is not implemented yet", fix=f"tracked in the issue '{issue}'")
