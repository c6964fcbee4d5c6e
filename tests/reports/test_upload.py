"""Upload to a real sqlite MLflow store: runs, metrics, tables, artifacts, registry, idempotency, no secrets."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from qverify.models import GateReport
from qverify.reports.compare import compare
from qverify.reports.registry import RC_ALIAS
from qverify.reports.tracking import resolve, session
from qverify.reports.upload import upload_gate

from .fixtures import SECRETS, build_id

MODEL = "qverify-tiny"


def _runs(client, gate_id):
    exp = client.get_experiment_by_name(f"qverify/{MODEL}")
    return client.search_runs([exp.experiment_id], f"tags.`qverify.gate_id` = '{gate_id}'", max_results=1000)


def _gate(workdir, gate_id="g-main") -> GateReport:
    return GateReport.model_validate_json((workdir / "gates" / gate_id / "gate.json").read_text())


def test_layout_gate_build_suite_runs(client, uploaded, workdir):
    runs = _runs(client, "g-main")
    assert Counter(r.data.tags["qverify.role"] for r in runs) == {"gate": 1, "build": 3, "suite": 12}
    assert {r.info.status for r in runs} == {"FINISHED"}
    by_id = {r.info.run_id: r for r in runs}
    gate = by_id[uploaded.run_id]
    for rid in uploaded.build_runs.values():
        assert by_id[rid].data.tags["mlflow.parentRunId"] == uploaded.run_id
    for key, rid in uploaded.suite_runs.items():
        assert by_id[rid].data.tags["mlflow.parentRunId"] == uploaded.build_runs[key.split("/")[0]]
    assert client.get_experiment(uploaded.experiment_id).artifact_location.startswith((workdir / "mlartifacts").as_uri())
    p, t = gate.data.params, gate.data.tags
    assert t["qverify.verdict"] == "FAIL" and t["qverify.gate_id"] == "g-main"
    assert p["baseline.build_id"] == build_id("bf16") and p["candidate.0.recipe"] == "fp8kv_nvfp4shared"
    assert p["suite.coding.version"] == "1" and p["suite.longctx.replicates"] == "3"
    assert p["serving.backend"] == "sglang" and p["serving.flags.speculative-algorithm"] == "EAGLE"
    assert gate.data.metrics["n_fail"] == 1 and gate.data.metrics["n_pass"] == 1


def test_suite_metrics_match_gate_json(client, uploaded, workdir):
    gate = _gate(workdir)
    for c in gate.candidates:
        for suite in ("coding", "toolcall", "longctx", "kld"):
            run = client.get_run(uploaded.suite_runs[f"{c.build_id}/{suite}"])
            for m in (m for m in c.metrics if m.metric.startswith(suite + "/")):
                name = m.metric.split("/", 1)[1].replace("@", "_at_")
                got = run.data.metrics
                assert got[f"{name}.delta"] == pytest.approx(m.delta)
                assert got[f"{name}.ci_low"] == pytest.approx(m.ci_low) and got[f"{name}.ci_high"] == pytest.approx(m.ci_high)
                assert got[f"{name}.noise_band"] == pytest.approx(m.noise_band) and got[f"{name}.mde"] == pytest.approx(m.mde)
                assert got[f"{name}.p_value"] == pytest.approx(m.p_value)
                assert got[f"{name}.flips.regressed"] == m.flips["regressed"]
                assert got[f"{name}.verdict"] == {"PASS": 1, "INCONCLUSIVE": 0, "FAIL": -1}[m.verdict]
                assert run.data.tags[f"verdict.{name}"] == m.verdict
                hist = client.get_metric_history(run.info.run_id, f"{name}.replicate_mean")
                assert [h.value for h in sorted(hist, key=lambda h: h.step)] == pytest.approx(m.candidate_spread)
    base = client.get_run(uploaded.suite_runs[f"{build_id('bf16')}/coding"])
    ref = next(m for m in gate.candidates[0].metrics if m.metric == "coding/pass@1")
    assert base.data.metrics["pass_at_1.mean"] == pytest.approx(ref.baseline_mean)
    hist = client.get_metric_history(base.info.run_id, "replicate.pass_at_1")  # from the raw ItemResults
    assert [h.value for h in sorted(hist, key=lambda h: h.step)] == pytest.approx(ref.baseline_spread)


def test_item_tables_and_parquet(client, uploaded, workdir, tmp_path):
    rid = uploaded.suite_runs[f"{build_id('nvfp4_all')}/toolcall"]
    with session(resolve(workdir)) as c:  # load_table searches through the fluent tracking URI
        table = c.load_table(uploaded.experiment_id, "items.json", run_ids=[rid])
        flips = c.load_table(uploaded.experiment_id, "flips.json", run_ids=[rid])
    assert len(table) == 24 * 3 and {"item_id", "replicate", "score.exact_call", "tool_calls"} <= set(table.columns)
    assert (flips["direction"] == "regressed").sum() >= 1
    local = client.download_artifacts(rid, "items/toolcall.parquet", str(tmp_path))
    import pandas as pd

    assert len(pd.read_parquet(local)) == len(table)


def _artifact_paths(client, rid, path=None) -> set[str]:
    out = set()
    for f in client.list_artifacts(rid, path):
        out |= _artifact_paths(client, rid, f.path) if f.is_dir else {f.path}
    return out


def test_artifacts(client, uploaded):
    gate_files = _artifact_paths(client, uploaded.run_id)
    assert {"gate.json", "report.md", "report.html", "plots/forest.png", "plots/longctx.png", "plots/replicates.png",
            "plots/capacity.png", "plots/accept_length.png"} <= gate_files
    cand = build_id("fp8kv_nvfp4shared")
    build_files = _artifact_paths(client, uploaded.build_runs[cand])
    assert {"build.json", "recipe.yaml", "server_command.sh", f"logs/serve-{cand}.log", "runs/coding.manifest.json"} <= build_files


def test_registry_registers_pass_only_and_moves_the_alias(client, uploaded):
    name = "qverify-tiny"
    passing, failing = build_id("fp8kv_nvfp4shared"), build_id("nvfp4_all")
    [reg] = uploaded.registered
    assert reg.build_id == passing and reg.alias == RC_ALIAS
    mv = client.get_model_version(name, reg.version)
    assert mv.tags["gate"] == "passed" and mv.tags["build_id"] == passing and mv.tags["gate_run_id"] == uploaded.run_id
    assert mv.source.startswith("models:/m-") and mv.current_stage == "None"  # an external logged model, no stages
    assert not client.search_model_versions(f"name = '{name}' and tags.build_id = '{failing}'")


def test_second_upload_is_skipped(client, uploaded, workdir):
    before = len(_runs(client, "g-main"))
    versions = len(client.search_model_versions("name = 'qverify-tiny'"))
    again = upload_gate(workdir, "g-main")
    assert again.skipped and again.run_id == uploaded.run_id
    assert len(_runs(client, "g-main")) == before
    assert len(client.search_model_versions("name = 'qverify-tiny'")) == versions
    assert [v.version for v in again.registered] == [v.version for v in uploaded.registered]


def test_no_secrets_anywhere(client, uploaded, workdir):
    # the fixture really planted them (so this test can fail)
    assert SECRETS["command"] in (workdir / "runs" / build_id("bf16") / "coding" / "manifest.json").read_text()
    blobs: list[bytes] = [(workdir / "mlflow.db").read_bytes()]
    blobs += [p.read_bytes() for p in (workdir / "mlartifacts").rglob("*") if p.is_file()]
    blobs += [p.read_bytes() for p in (workdir / "gates" / "g-main" / "report").rglob("*") if p.is_file()]
    for r in _runs(client, "g-main"):
        blobs.append(repr((r.data.params, r.data.tags)).encode())
    for mv in client.search_model_versions("name = 'qverify-tiny'"):
        blobs.append(repr(mv.tags).encode())
    leaks = {k for k, s in SECRETS.items() for b in blobs if s.encode() in b}
    assert not leaks, f"secrets leaked: {leaks}"
    cmd = client.download_artifacts(uploaded.build_runs[build_id("bf16")], "server_command.sh")
    assert "--api-key '***'" in Path(cmd).read_text()


def test_inconclusive_not_registered_and_alias_moves(client, uploaded, workdir):
    assert _gate(workdir, "g-second").candidates[0].verdict == "INCONCLUSIVE"
    second = upload_gate(workdir, "g-second")
    assert second.registered == []
    assert not client.search_model_versions(f"name = 'qverify-tiny' and tags.build_id = '{build_id('fp8kv')}'")
    first = client.get_model_version_by_alias("qverify-tiny", RC_ALIAS)
    third = upload_gate(workdir, "g-third")
    [v] = third.registered
    now = client.get_model_version_by_alias("qverify-tiny", RC_ALIAS)
    assert str(now.version) == v.version != str(first.version) and now.tags["gate_id"] == "g-third"


def test_compare_ranks_every_candidate(client, uploaded, workdir):
    upload_gate(workdir, "g-second")  # skipped when the test above already uploaded it
    df = compare(workdir)
    assert list(df["recipe"]) == ["fp8kv_nvfp4shared", "fp8kv", "nvfp4_all"]
    assert list(df["rank"]) == [1, 2, 3] and list(df["verdict"]) == ["PASS", "INCONCLUSIVE", "FAIL"]
    assert set(df["baseline"]) == {build_id("bf16")}
    assert df.loc[0, "kv_tokens_ratio"] == pytest.approx(2.0) and df.loc[0, "weights_change"] == pytest.approx(-0.07, abs=1e-3)
    assert list(compare(workdir, baseline="bf16")["recipe"]) == list(df["recipe"])
