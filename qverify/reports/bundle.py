"""Everything a release review reads, loaded once from the local workdir (the source of truth).

gate.json (GateReport) + builds/<id>/build.json (BuildManifest) + runs/<id>/<suite>/
(RunManifest and r<k>.jsonl ItemResults). Nothing here talks to MLflow.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.evals.store import load_run
from qverify.models import BuildManifest, CandidateReport, GateReport, ItemResult, MetricResult, RunManifest
from qverify.workdir import Workdir, is_build, is_regular_file, read_build_manifest

_GATE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


@dataclass
class SuiteRun:
    build_id: str
    suite: str
    manifest: RunManifest | None
    results: dict[int, list[ItemResult]]

    def by_item(self) -> dict[str, list[ItemResult]]:
        out: dict[str, list[ItemResult]] = {}
        for k in sorted(self.results):
            for r in self.results[k]:
                out.setdefault(r.item_id, []).append(r)
        return out


@dataclass
class GateBundle:
    workdir: Path
    gate: GateReport
    builds: dict[str, BuildManifest | None]
    runs: dict[tuple[str, str], SuiteRun]
    logs: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def gate_id(self) -> str:
        return self.gate.gate_id

    @property
    def wd(self) -> Workdir:
        return Workdir.at(self.workdir)

    @property
    def gate_dir(self) -> Path:
        return self.wd.gate_dir(self.gate_id)

    @property
    def build_ids(self) -> list[str]:
        return [self.gate.baseline] + [c.build_id for c in self.gate.candidates]

    @property
    def suites(self) -> list[str]:
        seen: list[str] = []
        for c in self.gate.candidates:
            for m in c.metrics:
                s = suite_of(m)
                if s not in seen:
                    seen.append(s)
        for s in self.gate.config.get("suites", []) or []:
            if s not in seen:
                seen.append(s)
        return seen

    @property
    def model(self) -> str:
        """The model the gate is about, named after the baseline's source (an experiment per model)."""
        base = self.builds.get(self.gate.baseline)
        src = (base.source_model if base else None) or self.gate.config.get("model") or "unknown-model"
        return Path(str(src).rstrip("/")).name or str(src)

    def recipe(self, build_id: str) -> str:
        b = self.builds.get(build_id)
        if b is not None:
            return b.recipe
        if build_id == self.gate.baseline:
            return self.gate.baseline_recipe
        return next((c.recipe for c in self.gate.candidates if c.build_id == build_id), "?")

    def label(self, build_id: str) -> str:
        return f"{self.recipe(build_id)} ({build_id[:8]})"

    def candidate(self, build_id: str) -> CandidateReport:
        return next(c for c in self.gate.candidates if c.build_id == build_id)

    def suite_metrics(self, cand: CandidateReport, suite: str) -> list[MetricResult]:
        return [m for m in cand.metrics if suite_of(m) == suite]

    def perf(self, build_id: str) -> dict[str, float]:
        """Serving performance for a build: the mean over its suite runs, overlaid by the gate's own figures."""
        acc: dict[str, list[float]] = {}
        for (b, _), run in self.runs.items():
            if b == build_id and run.manifest is not None:
                for k, v in run.manifest.perf.items():
                    acc.setdefault(k, []).append(float(v))
        out = {k: sum(v) / len(v) for k, v in acc.items()}
        # the eval runner records TTFT and accept length per item; average them when the manifest has none
        for name, attr in (("ttft_s", "ttft_s"), ("accept_length", "accept_length")):
            if perf_value(out, name.split("_")[0]) is None:
                vals = [getattr(r, attr) for (b, _), run in self.runs.items() if b == build_id
                        for rs in run.results.values() for r in rs if getattr(r, attr) is not None and r.error is None]
                if vals:
                    out[name] = sum(vals) / len(vals)
        for c in self.gate.candidates:
            if c.build_id == build_id:
                out.update(c.perf)
        return out

    def server_command(self, build_id: str) -> list[str] | None:
        for (b, _), run in self.runs.items():
            if b == build_id and run.manifest is not None and run.manifest.server_command:
                return run.manifest.server_command
        return None


def suite_of(m: MetricResult) -> str:
    return m.metric.split("/", 1)[0]


def metric_name(m: MetricResult) -> str:
    return m.metric.split("/", 1)[1] if "/" in m.metric else m.metric


def perf_value(perf: dict[str, float], *needles: str) -> float | None:
    """perf keys are named by whoever measured them (ttft_s, ttft_ms, decode_tok_s...): match by substring."""
    for k, v in perf.items():
        if any(n in k.lower() for n in needles):
            return float(v)
    return None


def check_gate_id(gate_id: str) -> str:
    if not _GATE_ID.match(gate_id or ""):
        raise BadInput(f"gate id {gate_id!r} is not a valid id", fix="pass the folder name under <workdir>/gates/")
    return gate_id


def as_path(workdir: Path | str | Workdir) -> Path:
    """Commands hold a Workdir, library callers a path: accept both."""
    return Workdir.at(workdir).root


def load_gate(workdir: Path | str | Workdir, gate_id: str) -> GateBundle:
    wd = Workdir.at(workdir)
    path = wd.gate_report_path(check_gate_id(gate_id))
    if not path.exists():
        known = wd.gate_ids()
        hint = f"known gates: {', '.join(known[-5:])}" if known else "run 'qverify gate' first"
        raise BadInput(f"no gate {gate_id!r} in {wd.gates}", fix=hint)
    try:
        gate = GateReport.model_validate_json(path.read_text())
    except ValueError as e:
        raise BadInput(f"{path} is not a valid GateReport ({str(e).splitlines()[0]})",
                       fix="re-run 'qverify gate' to rewrite it") from None
    builds: dict[str, BuildManifest | None] = {}
    for b in [gate.baseline] + [c.build_id for c in gate.candidates]:
        builds[b] = read_build_manifest(wd.build_dir(b)) if is_build(wd.build_dir(b)) else None
    bundle = GateBundle(workdir=wd.root, gate=gate, builds=builds, runs={})
    for b in builds:
        for s in bundle.suites:
            manifest, results = load_run(wd.runs, b, s)
            if manifest is not None or results:
                bundle.runs[(b, s)] = SuiteRun(b, s, manifest, results)
        bundle.logs[b] = _own_logs(wd, b)
    return bundle


def _own_logs(wd: Workdir, build_id: str) -> list[Path]:
    """The build's logs: regular files inside the workdir only. A symlinked log (or logs/ folder) was bundled and
    uploaded to MLflow with whatever it pointed to."""
    logs = wd.logs
    if not logs.is_dir() or not logs.resolve().is_relative_to(wd.root.resolve()):
        return []
    return sorted(p for p in logs.glob(f"*{build_id[:12]}*") if is_regular_file(p))


def item_rows(run: SuiteRun, max_chars: int = 2000) -> list[dict[str, Any]]:
    """One flat row per (item, replicate): the per-item table logged to MLflow and to parquet."""
    rows = []
    for k in sorted(run.results):
        for r in run.results[k]:
            resp = r.response
            row: dict[str, Any] = {
                "item_id": r.item_id, "suite": r.suite, "replicate": r.replicate, "seed": r.seed,
                "error": r.error, "reason": r.reason,
                "finish_reason": resp.finish_reason if resp else None,
                "response": (resp.content or "")[:max_chars] if resp else None,
                "tool_calls": "; ".join(f"{t.name}({t.arguments})" for t in resp.tool_calls)[:max_chars] if resp else None,
                "latency_s": r.latency_s, "ttft_s": r.ttft_s, "accept_length": r.accept_length,
            }
            for key, v in r.scores.items():
                row[f"score.{key}"] = v
            for key, v in r.metadata.items():
                if isinstance(v, (str, int, float, bool)):
                    row[f"meta.{key}"] = v
            rows.append(row)
    return rows
