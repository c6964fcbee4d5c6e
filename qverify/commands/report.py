"""`qverify report`: write the release review for a gate and upload it to MLflow, or rank candidates.

    qverify report --gate ID [--tracking-uri URI] [--no-registry]
    qverify report --compare [--baseline BUILD] [--tracking-uri URI]

A tracking failure exits 3 with the replay command; it never changes a verdict.
"""

from __future__ import annotations

from typing import Annotated

import typer

from qverify.commands._common import BaselineOpt, ConfigOpt, TrackingUriOpt, TrustOpt, state


def report_cmd(
    ctx: typer.Context,
    gate: Annotated[str | None, typer.Option("--gate", help="gate id (a folder under <workdir>/gates/)")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="rank every candidate gated against a baseline, from MLflow")] = False,
    baseline: BaselineOpt = None,
    tracking_uri: TrackingUriOpt = None,
    no_registry: Annotated[bool, typer.Option("--no-registry", help="do not register PASSing builds in the model registry")] = False,
    trust_remote_code: TrustOpt = False,  # accepted as by every command that takes a build; a report runs none of its code
    config: ConfigOpt = None,
) -> None:
    """Upload a gate to MLflow and write the release-review report."""
    from qverify.errors import BadInput
    from qverify.reports.publish import show_upload, stage_and_upload

    st = state(ctx)
    if tracking_uri is None:  # as the gate's upload does: the flag, else qverify.toml's
        from pathlib import Path

        from qverify.config import load_config

        tracking_uri = load_config(Path(config) if config else None).tracking_uri
    if compare == (gate is not None):
        raise BadInput("give exactly one of --gate ID or --compare", fix="e.g. 'qverify report --gate GATE_ID' or 'qverify report --compare'")
    if baseline and not compare:
        raise BadInput("--baseline applies only with --compare", fix="drop --baseline, or add --compare")
    if gate is not None:
        show_upload(st.out, stage_and_upload(st.workdir, gate, tracking_uri, not no_registry, st.out))
        return
    import math

    from qverify.reports.compare import compare as rank

    df = rank(st.workdir.root, baseline, tracking_uri)
    st.out.data(df.to_dict(orient="records"))
    fmt = lambda v, f: "–" if v is None or math.isnan(v) else f.format(v)
    # whole ids: a cut one (as_shipped-a) is no id any command takes; Δ/tolerance is upload._worst_ratio
    st.out.table(f"candidates against baseline {df['baseline'].iloc[0] if len(df) else '?'}",
                 ["rank", "recipe", "build", "verdict", "KV tokens ×", "weights Δ", "worst Δ/tolerance", "gate"],
                 [[r["rank"], r["recipe"], str(r["build_id"]),
                   r["verdict"] + (" (decided nothing)" if r.get("n_decided") == 0 else ""), fmt(r["kv_tokens_ratio"], "{:.2f}"),
                   fmt(r["weights_change"], "{:+.1%}"), fmt(r["worst_delta_ratio"], "{:+.2f}"), r["gate_id"]]
                  for r in df.to_dict(orient="records")])


def register(app: typer.Typer) -> None:
    app.command("report", help="Upload a gate to MLflow and write the release-review report.")(report_cmd)
