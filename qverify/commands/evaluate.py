"""`qverify eval BUILD`: replicated, resumable suite runs against one served build.

Settings come from qverify.toml (`--config`), each flag overriding its key; a flag left unset
keeps the file's value, else QVerifyConfig's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import (BUILD_REF_HELP, SEED_SALT_HELP, ConfigOpt, Count, ErrorBudget, Limit, Port,
                                     Replicates, Seconds, SeedSalt, TrustOpt, state)


def eval_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help=BUILD_REF_HELP)],
    suites: Annotated[str | None, typer.Option(help="comma-separated suite names; lmeval:<task> for lm-eval tasks "
                                                    "(default: qverify.toml's suites)")] = None,
    replicates: Annotated[int | None, typer.Option(callback=Replicates, help="runs per item, seeds differ per replicate (default 3)")] = None,
    backend: Annotated[str | None, typer.Option(help="local | sglang | endpoint (default: from --profile, else local)")] = None,
    profile: Annotated[str | None, typer.Option(help="serving profile name or YAML (sglang)")] = None,
    endpoint: Annotated[str | None, typer.Option(help="URL of a running server (backend endpoint)")] = None,
    api_key_env: Annotated[str | None, typer.Option(help="env var holding the endpoint's API key")] = None,
    served_model: Annotated[str | None, typer.Option(help="the model name the endpoint serves, where its answers and "
                                                          "/v1/models name none (recorded as declared)")] = None,
    concurrency: Annotated[int | None, typer.Option(callback=Count, help="requests in flight (default: local 256, else 64)")] = None,
    limit: Annotated[int | None, typer.Option(callback=Limit, help="items per suite (default: each suite's own)")] = None,
    split: Annotated[str, typer.Option(help="test (default; what the model card reports), validation or train")] = "test",
    source: Annotated[str | None, typer.Option(help="synthetic (default), or a suite's real-data source (humaneval, bfcl)")] = None,
    port: Annotated[int | None, typer.Option(callback=Port, help="server port (default: a free one)")] = None,
    error_budget: Annotated[float | None, typer.Option(callback=ErrorBudget, help="max infrastructure-error rate for a complete run (default: qverify.toml's error_budget)")] = None,
    fresh: Annotated[bool, typer.Option(help="start suites whose stored results don't match over")] = False,
    connect_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds to connect (default: the backend's)")] = None,
    read_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds between bytes (default: the backend's)")] = None,
    item_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds per item, retries included (default: the backend's)")] = None,
    allow_unsandboxed: Annotated[bool, typer.Option(help="run coding answers without bwrap (marked; never gated against sandboxed runs)")] = False,
    seed_salt: Annotated[int | None, typer.Option("--seed-salt", callback=SeedSalt, help=SEED_SALT_HELP)] = None,
    trust_remote_code: TrustOpt = False,
    config: ConfigOpt = None,
) -> None:
    """Run suites with replicates against a served build (one server launch per build)."""
    from qverify.config import load_config
    from qverify.pipeline import EvalSpec, evaluate_build, serving_profile

    s = state(ctx)
    cfg = load_config(Path(config) if config else None)
    names = [x.strip() for x in suites.split(",") if x.strip()] if suites is not None else None
    spec = EvalSpec.from_config(cfg, suites=names, replicates=replicates, concurrency=concurrency, limit=limit,
                                split=split, source=source, port=port, error_budget=error_budget, fresh=fresh,
                                serving=serving_profile(cfg.serving, backend, profile, endpoint, api_key_env, served_model),
                                connect_timeout_s=connect_timeout, read_timeout_s=read_timeout, item_timeout_s=item_timeout,
                                allow_unsandboxed=allow_unsandboxed or None, seed_salt=seed_salt,
                                trust_remote_code=trust_remote_code or None)
    summaries = evaluate_build(s.workdir, build, spec=spec, show_progress=not s.out.json_mode, warn=s.out.warn)
    s.out.table("eval", ["suite", "metric", "mean", "replicate spread", "errors", "complete", "tok/s/req", "accept len", "TTFT ms"],
                [x.row() for x in summaries])
    s.out.data([x.__dict__ for x in summaries])
    if not all(x.complete for x in summaries):
        s.out.warn("some runs are incomplete (infrastructure errors above budget); the gate will refuse to pass them")
        raise typer.Exit(3)


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_cmd)
