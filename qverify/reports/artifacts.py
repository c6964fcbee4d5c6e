"""Stage the release review locally (gates/<id>/report/) before anything talks to MLflow.

Local first: the report, plots, per-item parquet and redacted manifests exist on disk
whether or not the tracking server is up, and the upload only copies them.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from qverify.reports.bundle import GateBundle, item_rows
from qverify.reports.redact import redact_command, redact_obj, redact_text, refresh
from qverify.reports.review import Review, build_review
from qverify.scrub import register_env
from qverify.workdir import BUILD_MANIFEST, open_nofollow

MAX_LOG_BYTES = 2_000_000  # the tail of a server log is what explains a failure


@dataclass
class Staged:
    review: Review
    dir: Path
    report_md: Path
    report_html: Path
    gate_json: Path
    plots: dict[str, Path]
    builds: dict[str, Path] = field(default_factory=dict)  # build id -> folder of its artifacts
    items: dict[tuple[str, str], Path] = field(default_factory=dict)  # (build, suite) -> parquet


def _write_json(path: Path, obj: object) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(redact_obj(obj), indent=2, default=str))
    return path


def _stage_build(bundle: GateBundle, build_id: str, out: Path) -> Path:
    d = out / "builds" / build_id
    d.mkdir(parents=True, exist_ok=True)
    m = bundle.builds.get(build_id)
    if m is not None:
        _write_json(d / BUILD_MANIFEST, m.model_dump(mode="json"))
        (d / "recipe.yaml").write_text(redact_text(m.recipe_text))
    cmd = bundle.server_command(build_id)
    if cmd:
        (d / "server_command.sh").write_text("#!/bin/sh\n" + shlex.join(redact_command(cmd)) + "\n")
    for (b, suite), run in bundle.runs.items():
        if b == build_id and run.manifest is not None:
            _write_json(d / "runs" / f"{suite}.manifest.json", run.manifest.model_dump(mode="json"))
    for log in bundle.logs.get(build_id, []):
        with os.fdopen(open_nofollow(log), "rb") as f:  # checked a regular file when bundled; still no link now
            size = os.fstat(f.fileno()).st_size
            if size > MAX_LOG_BYTES:
                f.seek(size - MAX_LOG_BYTES)
            text = f.read().decode("utf-8", errors="replace")
        (d / "logs").mkdir(exist_ok=True)
        (d / "logs" / log.name).write_text(redact_text(text))
    return d


def stage(bundle: GateBundle, out: Path | None = None) -> Staged:
    """Write report.md/html, plots, items parquet and redacted copies of every manifest."""
    import pandas as pd

    from qverify.reports.plots import all_plots
    from qverify.reports.report import write_report

    refresh()
    for run in bundle.runs.values():  # the runs' keys, when this process can read them: masked like the rest
        if run.manifest is not None:
            register_env(run.manifest.serving.api_key_env)
    out = out or bundle.gate_dir / "report"
    if out.exists():
        shutil.rmtree(out)  # derived entirely from the gate folder: rebuild, never merge
    out.mkdir(parents=True)
    review = build_review(bundle)
    review.plots = all_plots(bundle, review.facts, out / "plots")
    md, html = write_report(review, out)
    staged = Staged(review=review, dir=out, report_md=md, report_html=html, plots=review.plots,
                    gate_json=_write_json(out / "gate.json", bundle.gate.model_dump(mode="json")))
    for b in bundle.build_ids:
        staged.builds[b] = _stage_build(bundle, b, out)
    for (b, suite), run in bundle.runs.items():
        rows = redact_obj(item_rows(run))
        if rows:
            p = out / "items" / b / f"{suite}.parquet"
            p.parent.mkdir(parents=True, exist_ok=True)
            pd.DataFrame(rows).to_parquet(p, index=False)
            staged.items[(b, suite)] = p
    return staged
