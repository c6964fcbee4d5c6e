"""`qverify gate --recipe fp8kv_nvfp4shared` end to end on the embedded default, with small counts.

Real builds (llm-compressor on qverify-tiny), real local servers, real scores; the point is
the whole path, not the verdict: any of PASS / FAIL / INCONCLUSIVE is acceptable at 6 items.
"""

from __future__ import annotations

import json
import subprocess
import sys


def test_gate_recipe_builds_evaluates_and_gates_with_json_on_stdout(tmp_path):
    (tmp_path / "qverify.toml").write_text(
        'suites = ["coding", "toolcall", "kld"]\nreplicates = 2\nlimit = 12\nreport = false\n')
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "gate",
                        "--recipe", "fp8kv_nvfp4shared", "--json"],
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
