"""The GPU acceptance script's dry run in CI: every step that needs no GPU, through the wrapper a GPU host runs
(benchmarks/gpu/sglang_smoke.sh -> sglang_acceptance.py). A flag SGLang 0.5.23 or qverify's CLI no longer
accepts, a build that no longer makes, or a host-side comparison that no longer runs fails here, not on the GPU.
The dry run's host side runs end to end with the engine standing in for SGLang, so its comparisons must pass."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("acceptance")  # shared: the variants reuse the builds (same inputs, same ids)


@pytest.mark.parametrize("variant", [[], ["--sm100", "--tp", "4"]], ids=["h200-tp1", "b200-trtllm-tp4"])
def test_dry_run_passes_and_prints_every_check(workdir, variant):
    pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23 (+ light deps, triton)")
    r = subprocess.run(["bash", "benchmarks/gpu/sglang_smoke.sh", "--dry-run", "--workdir", str(workdir), *variant],
                       cwd=REPO, capture_output=True, text=True, timeout=2400, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = {s["check"]: s for s in json.loads((workdir / "acceptance.json").read_text())}
    for name in ("bubblewrap works (before anything starts)", "SGLang parses the tiny-candidate command",
                 "SGLang parses the kimi-fp8kv command", "gate call matches the CLI", "eval call matches the CLI",
                 "engine vs SGLang, tiny fp8kv (fp8_e4m3 KV)", "engine vs SGLang, kimi fp8kv (fp8_e4m3 KV)",
                 "live k_scale of badscale is 0.25"):
        assert steps[name]["status"] == "ok", steps[name]
    plan = [s for s in steps if s.startswith("will check: ")]
    assert "will check: engine vs SGLang, kimi_k25 fixture fp8kv (fp8_e4m3 KV)" in plan
    gate = steps["will check: gate: badscale must FAIL, the candidate must not FAIL"]["detail"]
    assert "spec STANDALONE/compressed-tensors" in steps["SGLang parses the tiny-candidate command"]["detail"]
    if variant:  # B200: trtllm_mla reads k_scale, so badscale must FAIL; the kimi fixture at TP4 (16 heads per rank)
        assert "badscale must FAIL" in gate
        assert "attention trtllm_mla" in steps["SGLang parses the kimi-fp8kv command"]["detail"]
        assert "tp 4" in steps["SGLang parses the kimi-fp8kv command"]["detail"]
        assert "live k_scale 0.25" in steps["live k_scale of badscale is 0.25"]["detail"]
    else:
        assert "badscale must not FAIL (backend ignores k_scale)" in gate
        assert "attention flashinfer" in steps["SGLang parses the kimi-fp8kv command"]["detail"]


def test_a_flag_sglang_rejects_fails_the_dry_run():
    """What the old script's plain --cuda-graph-max-bs would have done (ambiguous in SGLang 0.5.23)."""
    pytest.importorskip("sglang")
    import benchmarks.gpu.sglang_acceptance as acc

    with pytest.raises(SystemExit, match="SGLang rejects"):
        acc.parse_with_sglang(["python", "-m", "sglang.launch_server", "--model-path", "m", "--cuda-graph-max-bs", "16"])


def test_a_gate_flag_the_cli_lacks_fails_the_dry_run(tmp_path):
    """What the old script's `gate --n-boot 500` would have done: each call is checked against `qverify <cmd> --help`."""
    import benchmarks.gpu.sglang_acceptance as acc

    run = acc.Run(acc.argparse.Namespace(dry_run=True, workdir=str(tmp_path), port=1, tp=1, sm100=False, limit=2,
                                         replicates=1, ready_timeout=1.0))
    argv = acc.gate_argv({"bf16": "a", "fp8kv_badscale": "b", acc.CANDIDATE: "c"})
    assert acc.unknown_flags(run, "gate", argv) == []
    assert acc.unknown_flags(run, "gate", [*argv, "--n-boot", "500"]) == ["--n-boot"]
    assert acc.unknown_flags(run, "eval", acc.eval_argv(run, "a", tmp_path / "p.yaml")) == []
