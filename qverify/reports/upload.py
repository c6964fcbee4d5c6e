"""upload_gate: copy a staged release review into MLflow, once per gate id, in one phase.

Layout in MLflow (an experiment per model, `qverify/<model>`):
  gate run (params: recipes, build ids, serving, suite versions, replicates; tags: verdict, gate id)
  └─ build run per build (baseline and candidates: size, KV, perf, verdict; build manifests, logs)
     └─ suite run per build × suite (means, replicate spread, Δ, bounds, run-to-run SD, MDE, p, flips,
        verdict; per-item table and parquet)
Idempotent: a FINISHED gate run with the same gate id means skip. Runs a failed upload
left behind (RUNNING after a killed server, or FAILED) are tagged superseded and FAILED.
"""

from __future__ import annotations

import contextlib
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qverify.models import MetricResult, RunManifest
from qverify.reports.artifacts import Staged, stage
from qverify.reports.bundle import GateBundle, as_path, load_gate, metric_name
from qverify.reports.facts import BuildFacts
from qverify.reports.redact import redact_obj, redact_text, refresh
from qverify.reports.registry import RegisteredVersion, register_passing
from qverify.reports.tracking import ensure_experiment, guard, replay_command, resolve, session

ROLE, GATE, SUPERSEDED = "qverify.role", "qverify.gate_id", "qverify.superseded"
VERDICT_CODE = {"PASS": 1.0, "INCONCLUSIVE": 0.0, "FAIL": -1.0}


@dataclass
class UploadResult:
    gate_id: str
    verdict: str
    tracking_uri: str
    experiment_id: str
    run_id: str
    skipped: bool = False
    superseded: list[str] = field(default_factory=list)
    build_runs: dict[str, str] = field(default_factory=dict)  # build id -> run id
    suite_runs: dict[str, str] = field(default_factory=dict)  # "build/suite" -> run id
    registered: list[RegisteredVersion] = field(default_factory=list)
    report_dir: Path | None = None


def key(name: str) -> str:
    """MLflow keys allow [A-Za-z0-9_-. /:]; pass@1 becomes pass_at_1."""
    return re.sub(r"[^A-Za-z0-9_\-. /:]", "_", name.replace("@", "_at_"))


def _flat(prefix: str, obj: Any, out: dict[str, str]) -> dict[str, str]:
    if isinstance(obj, dict):
        for k, v in obj.items():
            _flat(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif obj is not None:
        out[key(prefix)] = str(obj)[:500]
    return out


def _log(client, run_id: str, metrics: list[tuple[str, float, int]] = (), params: dict[str, str] | None = None,
         tags: dict[str, str] | None = None) -> None:
    """Synchronous, chunked to MLflow's batch limits; params and tags pass the redactor."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.utils.time import get_current_time_millis

    now = get_current_time_millis()
    ms = [Metric(key(k), float(v), now, step) for k, v, step in metrics if v is not None and math.isfinite(float(v))]
    ps = [Param(k, redact_text(str(v))) for k, v in redact_obj(params or {}).items()]
    ts = [RunTag(k, redact_text(str(v))[:7900]) for k, v in redact_obj(tags or {}).items()]
    for i in range(0, len(ms), 1000):
        client.log_batch(run_id, metrics=ms[i:i + 1000], synchronous=True)
    for i in range(0, len(ps), 100):
        client.log_batch(run_id, params=ps[i:i + 100], synchronous=True)
    for i in range(0, len(ts), 100):
        client.log_batch(run_id, tags=ts[i:i + 100], synchronous=True)


def _metric_values(m: MetricResult) -> list[tuple[str, float, int]]:
    n = key(metric_name(m))
    vals = {"baseline_mean": m.baseline_mean, "candidate_mean": m.candidate_mean, "delta": m.delta, "ci_low": m.ci_low,
            "ci_high": m.ci_high, "noise_band": m.noise_band, "tolerance": m.tolerance, "mde": m.mde, "p_value": m.p_value,
            "p_adjusted": m.p_adjusted, "verdict": VERDICT_CODE[m.verdict], "n_items": m.n_items,
            "candidate_spread": (max(m.candidate_spread) - min(m.candidate_spread)) if m.candidate_spread else None,
            "baseline_spread": (max(m.baseline_spread) - min(m.baseline_spread)) if m.baseline_spread else None}
    out = [(f"{n}.{k}", v, 0) for k, v in vals.items()]
    out += [(f"{n}.flips.{k}", v, 0) for k, v in m.flips.items()]
    out += [(f"{n}.replicate_mean", v, i) for i, v in enumerate(m.candidate_spread)]
    return out


def _worst_ratio(metrics: list[MetricResult]) -> float | None:
    """min over gated metrics of oriented Δ / tolerance; the tolerance is at -1."""
    vals = [(m.delta if m.direction == "higher" else -m.delta) / m.tolerance for m in metrics if m.gated and m.tolerance > 0]
    return min(vals) if vals else None


def _replicate_means(results: dict) -> list[tuple[str, float, int]]:
    """(replicate.<score>, mean, replicate) straight from the item results, every score; errored items left out."""
    out = []
    for k, rs in results.items():
        scores: dict[str, list[float]] = {}
        for r in rs:
            if r.error is None:
                for sk, sv in r.scores.items():
                    scores.setdefault(sk, []).append(sv)
        out += [(f"replicate.{sk}", sum(v) / len(v), k) for sk, v in scores.items() if v]
    return out


def _run_params(rm: RunManifest | None) -> dict[str, str]:
    if rm is None:
        return {}
    p = {"suite_version": rm.suite_version, "item_set_hash": rm.item_set_hash, "n_items": rm.n_items,
         "replicates": rm.replicates, "split": rm.split, "source": rm.source, "error_rate": rm.error_rate,
         "complete": rm.complete, "sampling": rm.sampling.model_dump(), "serving": rm.serving.model_dump(exclude_none=True)}
    return _flat("", p, {})


class _Uploader:
    def __init__(self, client, exp_id: str, staged: Staged, step: list[str]):
        self.c, self.exp, self.s, self.step = client, exp_id, staged, step
        self.b: GateBundle = staged.review.bundle

    def _run(self, name: str, parent: str | None, tags: dict[str, str]) -> str:
        t = {GATE: self.b.gate_id, **tags, **({"mlflow.parentRunId": parent} if parent else {})}
        return self.c.create_run(self.exp, run_name=name, tags=t).info.run_id

    def gate_run(self) -> str:
        g, b = self.b.gate, self.b
        self.step.append("creating the gate run")
        rid = self._run(f"gate {g.gate_id}", None, {
            ROLE: "gate", "qverify.verdict": g.verdict, "qverify.baseline": g.baseline, "qverify.model": b.model,
            "qverify.candidates": ",".join(c.build_id for c in g.candidates),
            "mlflow.note.content": self.s.review.headline + "\n\nThe full review is the artifact report.html."})
        params: dict[str, str] = {"baseline.build_id": g.baseline, "baseline.recipe": g.baseline_recipe}
        for i, c in enumerate(g.candidates):
            params |= {f"candidate.{i}.build_id": c.build_id, f"candidate.{i}.recipe": c.recipe}
        for (bid, suite), run in b.runs.items():
            if bid == g.baseline and run.manifest is not None:
                params |= {f"suite.{suite}.version": run.manifest.suite_version, f"suite.{suite}.replicates": run.manifest.replicates,
                           f"suite.{suite}.n_items": run.manifest.n_items}
                params |= _flat("serving", run.manifest.serving.model_dump(exclude_none=True), {})
        params |= _flat("gate", {k: v for k, v in g.config.items() if k != "command"}, {})
        counts = [(f"n_{v.lower()}", sum(c.verdict == v for c in g.candidates), 0) for v in VERDICT_CODE]
        self.step.append("logging the gate run")
        _log(self.c, rid, [("verdict", VERDICT_CODE[g.verdict], 0), ("n_candidates", len(g.candidates), 0), *counts], params)
        return rid

    def gate_artifacts(self, rid: str) -> None:
        self.step.append("uploading the report")
        for p in (self.s.gate_json, self.s.report_md, self.s.report_html):
            self.c.log_artifact(rid, str(p))
        if self.s.plots:
            self.c.log_artifacts(rid, str(next(iter(self.s.plots.values())).parent), artifact_path="plots")

    def build_run(self, parent: str, f: BuildFacts) -> str:
        b, bid = self.b, f.build_id
        is_base = bid == b.gate.baseline
        cand = None if is_base else b.candidate(bid)
        self.step.append(f"logging build {bid[:12]}")
        tags = {ROLE: "build", "qverify.build_role": "baseline" if is_base else "candidate", "qverify.build_id": bid,
                "qverify.recipe": f.recipe, "qverify.baseline": b.gate.baseline}
        if cand:
            tags["qverify.verdict"] = cand.verdict
        rid = self._run(f"{'baseline' if is_base else 'candidate'} {f.recipe} {bid[:8]}", parent, tags)
        m = b.builds.get(bid)
        params = {"build_id": bid, "recipe": f.recipe}
        if m is not None:
            params |= {"recipe_hash": m.recipe_hash, "source_model": m.source_model, "source_hash": m.source_hash,
                       "kv_dtype": m.kv_dtype, "drafter": m.drafter, "control": m.control}
            params |= {f"scheme.{i}": f"{s.scheme} {','.join(s.targets)}" for i, s in enumerate(m.quantization)}
            params |= _flat("serving", m.serving, {}) | _flat("versions", m.versions, {})
        metrics = [("weights_bytes", f.weights_bytes, 0), ("kv_bytes_per_token", f.kv_bytes_per_token, 0),
                   ("kv_tokens_per_gib", f.kv_tokens_per_gib, 0), ("weights_change", f.weights_change, 0),
                   ("kv_tokens_ratio", f.kv_tokens_ratio, 0), ("perf.ttft_s", f.ttft_s, 0),
                   ("perf.decode_tok_s", f.decode_tok_s, 0), ("perf.accept_length", f.accept_length, 0)]
        if cand:
            gated = [x for x in cand.metrics if x.gated]
            metrics += [("verdict", VERDICT_CODE[cand.verdict], 0), ("n_gated", len(gated), 0),
                        ("n_fail", sum(x.verdict == "FAIL" for x in gated), 0),
                        ("n_inconclusive", sum(x.verdict == "INCONCLUSIVE" for x in gated), 0),
                        # metrics the gate decided (PASS or FAIL): 0 is a gate that decided nothing (report --compare)
                        ("n_decided", sum(x.verdict in ("PASS", "FAIL") for x in gated), 0),
                        ("worst_delta_ratio", _worst_ratio(cand.metrics), 0)]
            metrics += [(f"delta.{x.metric}", x.delta, 0) for x in cand.metrics]
        _log(self.c, rid, metrics, {k: v for k, v in params.items() if v is not None})
        self.c.log_artifacts(rid, str(self.s.builds[bid]))
        return rid

    def suite_run(self, parent: str, bid: str, suite: str) -> str:
        b = self.b
        run = b.runs.get((bid, suite))
        is_base = bid == b.gate.baseline
        self.step.append(f"logging {suite} of build {bid[:12]}")
        ms = [] if is_base else b.suite_metrics(b.candidate(bid), suite)
        tags = {ROLE: "suite", "qverify.build_id": bid, "qverify.suite": suite, "qverify.recipe": b.recipe(bid)}
        tags |= {key(f"verdict.{metric_name(m)}"): m.verdict for m in ms}
        if ms:
            tags["qverify.verdict"] = next((v for v in ("FAIL", "INCONCLUSIVE") if any(m.verdict == v and m.gated for m in ms)), "PASS")
        rid = self._run(f"{b.recipe(bid)} / {suite}", parent, tags)
        metrics: list[tuple[str, float, int]] = [x for m in ms for x in _metric_values(m)]
        if is_base:  # the baseline's own figures live on each candidate's MetricResult; take the first
            ref = next((c for c in b.gate.candidates if b.suite_metrics(c, suite)), None)
            for m in b.suite_metrics(ref, suite) if ref else []:
                n = key(metric_name(m))
                metrics += [(f"{n}.mean", m.baseline_mean, 0)] + [(f"{n}.replicate_mean", v, i) for i, v in enumerate(m.baseline_spread)]
        if run is not None:
            metrics += _replicate_means(run.results)
        _log(self.c, rid, metrics, _run_params(run.manifest if run else None) | {"suite": suite, "build_id": bid})
        parquet = self.s.items.get((bid, suite))
        if parquet is not None:
            import pandas as pd

            self.step.append(f"uploading the {suite} item table of build {bid[:12]}")
            self.c.log_table(rid, pd.read_parquet(parquet), "items.json")
            self.c.log_artifact(rid, str(parquet), artifact_path="items")
        if not is_base:
            from qverify.reports.flips import flipped

            fl = flipped(b, bid, limit=10**9)
            rows = [{"item_id": f.item_id, "direction": f.direction, "metric": f.metric, "candidate_reason": f.candidate.reason}
                    for f in fl if f.suite == suite]
            if rows:
                self.c.log_table(rid, redact_obj({k: [r[k] for r in rows] for k in rows[0]}), "flips.json")
        return rid


def _gate_runs(client, exp_id: str, gate_id: str) -> list:
    from mlflow.entities import ViewType

    return client.search_runs([exp_id], f"tags.`{GATE}` = '{gate_id}'", run_view_type=ViewType.ACTIVE_ONLY, max_results=5000)


def upload_gate(workdir: Path, gate_id: str, tracking_uri: str | None = None, *, registry: bool = True,
                staged: Staged | None = None) -> UploadResult:
    """Upload gate `gate_id` (skipped when already uploaded). Raises TrackingError, never changes the verdict."""
    workdir = as_path(workdir)
    staged = staged or stage(load_gate(workdir, gate_id))
    refresh()
    b = staged.review.bundle
    target = resolve(workdir, tracking_uri)
    step = ["connecting"]
    # guard first: a failure while the store is opened (created, migrated) also carries the replay command
    with guard(target, step, replay_command(gate_id, workdir, target)), session(target) as client:
        client.search_experiments(max_results=1)  # fail fast, before anything is written
        step.append("creating the experiment")
        exp_id = ensure_experiment(client, f"qverify/{b.model}", target)
        step.append("looking up earlier uploads")
        prior = _gate_runs(client, exp_id, gate_id)
        res = UploadResult(gate_id, b.gate.verdict, target.display, exp_id, "", report_dir=staged.dir)
        done = [r for r in prior if r.data.tags.get(ROLE) == "gate" and r.info.status == "FINISHED"
                and r.data.tags.get(SUPERSEDED) != "true"]
        if done:
            res.run_id, res.skipped = done[0].info.run_id, True
            res.build_runs = {r.data.tags["qverify.build_id"]: r.info.run_id for r in prior
                              if r.data.tags.get(ROLE) == "build" and r.data.tags.get(SUPERSEDED) != "true"}
            if registry:
                step.append("checking the model registry")
                res.registered = register_passing(client, b, exp_id, res.run_id, res.build_runs)
            return res
        up = _Uploader(client, exp_id, staged, step)
        res.run_id = up.gate_run()
        try:
            step.append("superseding a partial upload")
            for r in (r for r in prior if r.data.tags.get(SUPERSEDED) != "true"):
                _log(client, r.info.run_id, tags={SUPERSEDED: "true", "qverify.superseded_by": res.run_id})
                if r.info.status != "FAILED":
                    client.set_terminated(r.info.run_id, "FAILED")
                res.superseded.append(r.info.run_id)
            up.gate_artifacts(res.run_id)
            for f in staged.review.facts:
                brid = up.build_run(res.run_id, f)
                res.build_runs[f.build_id] = brid
                for suite in b.suites:
                    res.suite_runs[f"{f.build_id}/{suite}"] = up.suite_run(brid, f.build_id, suite)
                    client.set_terminated(res.suite_runs[f"{f.build_id}/{suite}"], "FINISHED")
                client.set_terminated(brid, "FINISHED")
            if registry:
                step.append("registering passing builds")
                res.registered = register_passing(client, b, exp_id, res.run_id, res.build_runs)
                if res.registered:
                    _log(client, res.run_id, tags={"qverify.registered": ",".join(f"{v.name}/{v.version}" for v in res.registered)})
            step.append("finishing the gate run")
            client.set_terminated(res.run_id, "FINISHED")
        except Exception:
            # best effort: a dead server cannot take this either, and the next upload supersedes the run
            with contextlib.suppress(Exception):
                client.set_terminated(res.run_id, "FAILED")
            raise
    return res
