"""`qverify eval BUILD`: replicated, resumable suite runs against one served build."""

from __future__ import annotations

from typing import Annotated

import typer

from qverify.commands._common import state

DEFAULT_SUITES = "coding,toolcall,longctx,verifier,kld"


def eval_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help="build id (or prefix) under <workdir>/builds, or a build dir")],
    suites: Annotated[str, typer.Option(help="comma-separated suite names; lmeval:<task> for lm-eval tasks")] = DEFAULT_SUITES,
    replicates: Annotated[int, typer.Option(help="runs per item (seeds differ per replicate)")] = 3,
    backend: Annotated[str | None, typer.Option(help="local | sglang | endpoint (default: from --profile, else local)")] = None,
    profile: Annotated[str | None, typer.Option(help="serving profile name or YAML (sglang)")] = None,
    endpoint: Annotated[str | None, typer.Option(help="URL of a running server (backend endpoint)")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="env var holding the endpoint's API key")] = None,
    concurrency: Annotated[int, typer.Option(help="requests in flight")] = 64,
    limit: Annotated[int | None, typer.Option(help="items per suite (default: each suite's own)")] = None,
    split: Annotated[str, typer.Option(help="held-out (default) or train")] = "held-out",
    source: Annotated[str, typer.Option(help="synthetic, or a suite's real-data source (humaneval, bfcl)")] = "synthetic",
    port: Annotated[int | None, typer.Option(help="server port (default: a free one)")] = None,
    error_budget: Annotated[float, typer.Option(help="max infrastructure-error rate for a complete run")] = 0.02,
    fresh: Annotated[bool, typer.Option(help="start suites whose stored results don't match over")] = False,
) -> None:
    """Run suites with replicates against a served build (one server launch per build)."""
    from qverify.evals.pipeline import evaluate_build
    from qverify.serve.profile import resolve_profile

    s = state(ctx)
    serving = resolve_profile(backend, profile, endpoint, api_key_env)
    names = [x.strip() for x in suites.split(",") if x.strip()]
    summaries = evaluate_build(s.workdir, build, names, replicates, serving, limit, split, source, concurrency,
                               error_budget, port, fresh, show_progress=not s.out.json_mode)
    s.out.table("eval", ["suite", "metric", "mean", "replicate spread", "errors", "complete", "tok/s/req", "accept len", "TTFT ms"],
                [x.row() for x in summaries])
    s.out.data([x.__dict__ for x in summaries])
    if not all(x.complete for x in summaries):
        s.out.warn("some runs are incomplete (infrastructure errors above budget); the gate will refuse to pass them")
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
