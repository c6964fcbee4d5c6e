"""`qverify suites list|show`: discover suites by name and look at their items."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from qverify.commands._common import Count, SourceOpt, SplitOpt, state

suites_app = typer.Typer(help="List suites and show example items.", no_args_is_help=True)


@suites_app.command("list")
def list_suites(ctx: typer.Context) -> None:
    """Each suite with version, primary metric, sampling and item sources."""
    from qverify.suites import get_suite, suites

    s = state(ctx)
    rows, data = [], []
    for name in suites.names():
        if name == "lmeval":
            continue
        suite = get_suite(name)
        counts = suite.item_counts()
        rows.append([name, suite.version, suite.primary_metric, f"T={suite.sampling.temperature}",
                     "; ".join(f"{k}: {v}" for k, v in counts.items()), suite.description])
        data.append({"name": name, "version": suite.version, "primary_metric": suite.primary_metric,
                     "sampling": suite.sampling.model_dump(), "sources": counts, "description": suite.description})
    rows.append(["lmeval:<task>", "-", "task's own", "task's", "any lm-eval task", "Any lm-evaluation-harness task against the endpoint"])
    s.out.table("suites", ["name", "version", "metric", "sampling", "items", "description"], rows)
    s.out.data(data)


@suites_app.command("show")
def show(
    ctx: typer.Context,
    name: str,
    n: Annotated[int, typer.Option("--n", callback=Count, help="how many items")] = 3,
    split: SplitOpt = "test",
    source: SourceOpt = None,
) -> None:
    """Print example items of a suite."""
    from qverify.errors import BadInput
    from qverify.suites import get_suite

    s = state(ctx)
    if split not in ("test", "validation", "train", "held-out"):  # held-out: the old name of test
        raise BadInput(f"unknown split {split!r}", fix="use --split test, validation or train")
    suite = get_suite(name)
    source = source or "synthetic"
    if source not in suite.sources:
        raise BadInput(f"suite {name} has no source {source!r}", fix=f"use one of: {', '.join(suite.sources)}")
    items = suite.items(split, n, source=source)[:n]
    if s.out.json_mode:
        s.out.data([i.model_dump() for i in items])
        return
    for it in items:
        s.out.console.rule(f"{it.id}  {json.dumps(it.metadata)}")
        if it.tools:
            s.out.console.print("tools: " + ", ".join(t["function"]["name"] for t in it.tools))
        for m in it.messages:
            s.out.console.print(f"{m['role']}: {m['content'][-800:]}", highlight=False, markup=False)
        if it.prompt:
            s.out.console.print(it.prompt[-800:], highlight=False, markup=False)
        s.out.console.print(f"target: {json.dumps(it.target)[:400]}", highlight=False, markup=False)


def register(app: typer.Typer) -> None:
    app.add_typer(suites_app, name="suites")
