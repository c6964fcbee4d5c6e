"""`qverify eval BUILD`: replicated, resumable suite runs against one served build.

Settings come from qverify.toml (`--config`), each flag overriding its key; a flag left unset
keeps the file's value, else QVerifyConfig's default.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from qverify.commands._common import (
    BUILD_REF_HELP,
    BackendOpt,
    ConfigOpt,
    Count,
    EndpointOpt,
    ErrorBudget,
    KeyEnvOpt,
    Limit,
    PortOpt,
    ProfileOpt,
    Replicates,
    Seconds,
    SeedSaltOpt,
    SourceOpt,
    SplitOpt,
    SuitesOpt,
    TrustOpt,
    state,
)


def eval_cmd(
    ctx: typer.Context,
    build: Annotated[str, typer.Argument(help=BUILD_REF_HELP)],
    suites: SuitesOpt = None,
    replicates: Annotated[int | None, typer.Option(callback=Replicates, help="runs per item, seeds differ per replicate (default 3)")] = None,
    backend: BackendOpt = None,
    profile: ProfileOpt = None,
    endpoint: EndpointOpt = None,
    api_key_env: KeyEnvOpt = None,
    served_model: Annotated[str | None, typer.Option(help="the model name the endpoint serves, where its answers and "
                                                          "/v1/models name none (recorded as declared)")] = None,
    concurrency: Annotated[int | None, typer.Option(callback=Count, help="requests in flight (default: local 256, else 64)")] = None,
    limit: Annotated[int | None, typer.Option(callback=Limit, help="items per suite (default: each suite's own)")] = None,
    split: SplitOpt = "test",
    source: SourceOpt = None,
    port: PortOpt = None,
    error_budget: Annotated[float | None, typer.Option(callback=ErrorBudget, help="max infrastructure-error rate for a complete run (default: qverify.toml's error_budget)")] = None,
    fresh: Annotated[bool, typer.Option(help="start suites whose stored results don't match over")] = False,
    connect_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds to connect (default: the backend's)")] = None,
    read_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds between bytes (default: the backend's)")] = None,
    item_timeout: Annotated[float | None, typer.Option(callback=Seconds, help="seconds per item, retries included (default: the backend's)")] = None,
    allow_unsandboxed: Annotated[bool, typer.Option(help="run coding answers without bwrap (marked; never gated against sandboxed runs)")] = False,
    seed_salt: SeedSaltOpt = None,
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
