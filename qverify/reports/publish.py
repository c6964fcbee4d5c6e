"""Publishing a gate: stage the release review, upload it to MLflow, say what happened.

`report_after_gate` is the step `qverify gate` ends with; `qverify report --gate` runs the same
upload on its own. A tracking failure never changes a verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qverify.workdir import Workdir


def stage_and_upload(workdir: Path | Workdir, gate_id: str, tracking_uri: str | None, registry: bool, out: Any) -> Any:
    """One process at a time per gate (evals.lock.gate_lock): the report folder is rebuilt, and the upload looks for
    an earlier run of the gate, so two at once would break the one and duplicate the other."""
    from qverify.evals.lock import gate_lock
    from qverify.reports.artifacts import stage
    from qverify.reports.bundle import load_gate
    from qverify.reports.upload import upload_gate

    bundle = load_gate(workdir, gate_id)  # an unknown gate is refused (4) before any lock file is made
    with gate_lock(bundle.gate_dir, out.info):
        staged = stage(bundle)
        out.info(f"report: {staged.report_html}")
        return upload_gate(workdir, gate_id, tracking_uri, registry=registry, staged=staged)


def show_upload(out: Any, res: Any) -> None:
    out.data({"gate_id": res.gate_id, "verdict": res.verdict, "tracking_uri": res.tracking_uri, "experiment_id": res.experiment_id,
              "run_id": res.run_id, "skipped": res.skipped, "superseded": res.superseded, "build_runs": res.build_runs,
              "registered": [vars(v) for v in res.registered], "report_dir": str(res.report_dir)})
    what = "already uploaded, skipped" if res.skipped else "uploaded"
    out.info(f"gate {res.gate_id} ({res.verdict}) {what}: run {res.run_id} in experiment {res.experiment_id}")
    out.info(f"  tracking: {res.tracking_uri}")  # its own line: a URI is long, and a CI log reads lines <= 100 columns
    if res.superseded:
        out.info(f"marked {len(res.superseded)} run(s) of an earlier partial upload superseded and FAILED")
    for v in res.registered:
        out.info(f"registered {v.name} version {v.version} (build {v.build_id})" + (f", alias {v.alias}" if v.alias else ""))


def report_after_gate(workdir: Path | Workdir, gate_id: str, tracking_uri: str | None = None, *, registry: bool = True, out: Any = None) -> int:
    """For `qverify gate`: write the review and upload it. Returns 0, or 3 after a warning; never raises, never touches the verdict."""
    from qverify.errors import QVerifyError
    from qverify.output import Output
    from qverify.reports.tracking import replay_command, resolve

    out = out or Output()
    wd = Workdir.at(workdir).root
    try:
        show_upload(out, stage_and_upload(wd, gate_id, tracking_uri, registry, out))
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
