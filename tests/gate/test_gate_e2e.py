"""`qverify gate --recipe fp8kv_nvfp4shared` end to end on the embedded default, with small counts.

Real builds (llm-compressor on qverify-tiny), real local servers, real scores; the point is
the whole path, not the verdict: any of PASS / FAIL / INCONCLUSIVE is acceptable at 6 items.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_gate_recipe_builds_evaluates_and_gates_with_json_on_stdout(tmp_path):
    (tmp_path / "qverify.toml").write_text(
        'suites = ["coding", "toolcall", "kld"]\nreplicates = 2\nlimit = 12\nreport = false\n')
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "gate",
                        "--recipe", "fp8kv_nvfp4shared", "--json", "--fixed"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert r.returncode in (0, 1, 2), r.stderr[-2000:]
    report = json.loads(r.stdout)  # one document: build and server logs went to stderr
    assert report["verdict"] == ["PASS", "FAIL", "INCONCLUSIVE"][r.returncode]
    cand = report["candidates"][0]
    assert cand["recipe"] == "fp8kv_nvfp4shared" and report["baseline_recipe"] == "bf16"
    metrics = {m["metric"]: m for m in cand["metrics"]}
    assert {"coding/pass@1", "toolcall/exact_call", "toolcall/trigger", "kld/kld"} <= set(metrics)
    for m in metrics.values():  # the full per-metric table
        assert {"delta", "ci_low", "ci_high", "noise_band", "mde", "verdict", "reason"} <= set(m)
    assert metrics["coding/pass@1"]["n_items"] == metrics["toolcall/exact_call"]["n_items"] == 12
    assert metrics["kld/kld"]["candidate_mean"] > 0  # real quantization moved the token distribution
    assert cand["perf"]["coding/ttft_s"] > 0  # performance captured during eval, with the run
    assert (tmp_path / "wd" / "gates" / report["gate_id"] / "gate.json").exists()

    # third-party chatter (llm-compressor's loguru, tqdm, transformers) is in the workdir's logs, not on the console
    noise = [ln for ln in r.stderr.splitlines() if " | INFO" in ln or "it/s]" in ln or "[transformers]" in ln]
    assert not noise, noise[:5]
    logs = tmp_path / "wd" / "logs"
    assert any("oneshot" in p.read_text() or "llmcompressor" in p.read_text() for p in logs.glob("llmcompressor-*.log"))

    # the same command again, piped as in CI: builds reused, evals a no-op (nothing rewritten, same gate id),
    # and the compact summary: one line per gated metric, the verdict line, nothing wider than 80 columns (README)
    manifests = {p: p.read_bytes() for p in (tmp_path / "wd" / "runs").rglob("manifest.json")}
    again = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "gate",
                            "--recipe", "fp8kv_nvfp4shared", "--fixed"],
                           cwd=tmp_path, capture_output=True, text=True, timeout=1200)
    assert again.returncode == r.returncode, again.stderr[-2000:]
    assert {p: p.read_bytes() for p in manifests} == manifests
    lines = again.stdout.splitlines()
    assert all(len(ln) <= 80 for ln in lines), [ln for ln in lines if len(ln) > 80]
    assert lines[-1] == f"gate {report['gate_id']}: {report['verdict']}"
    for m in (m for m in cand["metrics"] if m["gated"]):
        assert sum(1 for ln in lines if ln.split()[:1] == [m["metric"]] and m["verdict"] in ln) == 1, m["metric"]
