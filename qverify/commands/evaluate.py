"""`qverify eval BUILD`: replicated, resumable suite runs against one served build."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import ConfigOpt, Count, ErrorBudget, Port, Seconds, state

DEFAULT_SUITES = "coding,toolcall,longctx,verifier,kld"
TimeoutOpt = Annotated[float | None, typer.Option(callback=Seconds, help="seconds (default: the backend's; README)")]


def eval_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help="build id (or prefix) under <workdir>/builds, or a build dir")],
    suites: Annotated[str, typer.Option(help="comma-separated suite names; lmeval:<task> for lm-eval tasks")] = DEFAULT_SUITES,
    replicates: Annotated[int, typer.Option(callback=Count, help="runs per item (seeds differ per replicate)")] = 3,
    backend: Annotated[str | None, typer.Option(help="local | sglang | endpoint (default: from --profile, else local)")] = None,
    profile: Annotated[str | None, typer.Option(help="serving profile name or YAML (sglang)")] = None,
    endpoint: Annotated[str | None, typer.Option(help="URL of a running server (backend endpoint)")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="env var holding the endpoint's API key")] = None,
    concurrency: Annotated[int, typer.Option(callback=Count, help="requests in flight")] = 8,
    limit: Annotated[int | None, typer.Option(callback=Count, help="items per suite (default: each suite's own)")] = None,
    split: Annotated[str, typer.Option(help="held-out (default) or train")] = "held-out",
    source: Annotated[str, typer.Option(help="synthetic, or a suite's real-data source (humaneval, bfcl)")] = "synthetic",
    port: Annotated[int | None, typer.Option(callback=Port, help="server port (default: a free one)")] = None,
    error_budget: Annotated[float, typer.Option(callback=ErrorBudget, help="max infrastructure-error rate for a complete run")] = 0.02,
    fresh: Annotated[bool, typer.Option(help="start suites whose stored results don't match over")] = False,
    connect_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds to connect (default: the backend's)")] = None,
    read_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds between bytes (default: the backend's)")] = None,
    item_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds per item, retries included (default: the backend's)")] = None,
    allow_unsandboxed: Annotated[bool, typer.Option(help="run coding answers without bwrap (marked; never gated against sandboxed runs)")] = False,
    config: ConfigOpt = None,
) -> None:
    """Run suites with replicates against a served build (one server launch per build)."""
    from qverify.config import load_config
    from qverify.evals.client import timeouts_for
    from qverify.evals.pipeline import evaluate_build
    from qverify.serve.profile import resolve_profile

    s = state(ctx)
    cfg = load_config(Path(config) if config else None)
    serving = resolve_profile(backend, profile, endpoint, api_key_env)
    cl = cfg.client
    timeouts = timeouts_for(serving.backend, connect_timeout or cl.connect_timeout_s, read_timeout or cl.read_timeout_s,
                            item_timeout or cl.item_timeout_s)
    names = [x.strip() for x in suites.split(",") if x.strip()]
    summaries = evaluate_build(s.workdir, build, names, replicates, serving, limit, split, source, concurrency,
                               error_budget, port, fresh, show_progress=not s.out.json_mode, timeouts=timeouts,
                               allow_unsandboxed=allow_unsandboxed or cfg.allow_unsandboxed, warn=s.out.warn)
    s.out.table("eval", ["suite", "metric", "mean", "replicate spread", "errors", "complete", "tok/s/req", "accept len", "TTFT ms"],
                [x.row() for x in summaries])
    s.out.data([x.__dict__ for x in summaries])
    if not all(x.complete for x in summaries):
        s.out.warn("some runs are incomplete (infrastructure errors above budget); the gate will refuse to pass them")
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
