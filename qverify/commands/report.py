"""`qverify report`: write the release review for a gate and upload it to MLflow, or rank candidates.

    qverify report --gate ID [--tracking-uri URI] [--no-registry]
    qverify report --compare [--baseline BUILD] [--tracking-uri URI]

A tracking failure exits 3 with the replay command; it never changes a verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from qverify.commands._common import state

TrackingUriOpt = Annotated[str | None, typer.Option("--tracking-uri", help="MLflow server or DB (default: MLFLOW_TRACKING_URI, else sqlite in the workdir)")]


def _upload(workdir: Path, gate_id: str, tracking_uri: str | None, registry: bool, out: Any) -> Any:
    from qverify.reports.artifacts import stage
    from qverify.reports.bundle import load_gate
    from qverify.reports.upload import upload_gate

    staged = stage(load_gate(workdir, gate_id))
    out.info(f"report: {staged.report_html}")
    return upload_gate(workdir, gate_id, tracking_uri, registry=registry, staged=staged)


def _show(out: Any, res: Any) -> None:
    out.data({"gate_id": res.gate_id, "verdict": res.verdict, "tracking_uri": res.tracking_uri, "experiment_id": res.experiment_id,
              "run_id": res.run_id, "skipped": res.skipped, "superseded": res.superseded, "build_runs": res.build_runs,
              "registered": [vars(v) for v in res.registered], "report_dir": str(res.report_dir)})
    what = "already uploaded, skipped" if res.skipped else "uploaded"
    out.info(f"gate {res.gate_id} ({res.verdict}) {what}: run {res.run_id} in experiment {res.experiment_id} at {res.tracking_uri}")
    if res.superseded:
        out.info(f"marked {len(res.superseded)} run(s) of an earlier partial upload superseded and FAILED")
    for v in res.registered:
        out.info(f"registered {v.name} version {v.version} (build {v.build_id[:12]})" + (f", alias {v.alias}" if v.alias else ""))


def report_after_gate(workdir: Path, gate_id: str, tracking_uri: str | None = None, *, registry: bool = True, out: Any = None) -> int:
    """For `qverify gate`: write the review and upload it. Returns 0, or 3 after a warning; never raises, never touches the verdict."""
    from qverify.errors import QVerifyError
    from qverify.output import Output
    from qverify.reports.tracking import replay_command, resolve

    out = out or Output()
    from qverify.reports.bundle import as_path

    wd = as_path(workdir)
    try:
        _show(out, _upload(wd, gate_id, tracking_uri, registry, out))
        return 0
    except QVerifyError as e:
        out.warn(f"release review not uploaded; the verdict stands. {e.one_line()}")
    except Exception as e:  # noqa: BLE001 - a reporter bug must not cost the gate its verdict
        out.warn(f"release review failed ({type(e).__name__}: {e}); the verdict stands.")
    try:
        replay = replay_command(gate_id, wd, resolve(wd, tracking_uri))
    except QVerifyError:
        replay = f"qverify report --gate {gate_id}"
    out.warn(f"replay with: {replay}")
    return 3


def report_cmd(
    ctx: typer.Context,
    gate: Annotated[str | None, typer.Option("--gate", help="gate id (a folder under <workdir>/gates/)")] = None,
    compare: Annotated[bool, typer.Option("--compare", help="rank every candidate gated against a baseline, from MLflow")] = False,
    baseline: Annotated[str | None, typer.Option("--baseline", help="with --compare: baseline build id (prefix) or recipe; default the latest gate's")] = None,
    tracking_uri: TrackingUriOpt = None,
    no_registry: Annotated[bool, typer.Option("--no-registry", help="do not register PASSing builds in the model registry")] = False,
) -> None:
    """Upload a gate to MLflow and write the release-review report."""
    from qverify.errors import BadInput

    st = state(ctx)
    if compare == (gate is not None):
        raise BadInput("give exactly one of --gate ID or --compare", fix="e.g. 'qverify report --gate GATE_ID' or 'qverify report --compare'")
    if baseline and not compare:
        raise BadInput("--baseline applies only with --compare", fix="drop --baseline, or add --compare")
    if gate is not None:
        _show(st.out, _upload(st.workdir.root, gate, tracking_uri, not no_registry, st.out))
        return
    import math

    from qverify.reports.compare import compare as rank

    df = rank(st.workdir.root, baseline, tracking_uri)
    st.out.data(df.to_dict(orient="records"))
    fmt = lambda v, f: "–" if v is None or math.isnan(v) else f.format(v)
    st.out.table(f"candidates against baseline {df['baseline'].iloc[0][:12] if len(df) else '?'}",
                 ["rank", "recipe", "build", "verdict", "KV tokens ×", "weights Δ", "worst Δ/band", "gate"],
                 [[r["rank"], r["recipe"], str(r["build_id"])[:12], r["verdict"], fmt(r["kv_tokens_ratio"], "{:.2f}"),
                   fmt(r["weights_change"], "{:+.1%}"), fmt(r["worst_delta_ratio"], "{:+.2f}"), r["gate_id"]]
                  for r in df.to_dict(orient="records")])


def register(app: typer.Typer) -> None:
    app.command("report", help="Upload a gate to MLflow and write the release-review report.")(report_cmd)
