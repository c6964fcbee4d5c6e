"""The GPU acceptance script's dry run in CI: every step that needs no GPU, through the wrapper a GPU host runs
(benchmarks/gpu/sglang_smoke.sh -> sglang_acceptance.py). A flag SGLang 0.5.23 or qverify's CLI no longer
accepts, a build that no longer makes, or a capacity plan that no longer runs fails here, not on the GPU."""

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
def test_dry_run_passes(workdir, variant):
    pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23 (+ light deps, triton)")
    r = subprocess.run(["bash", "benchmarks/gpu/sglang_smoke.sh", "--dry-run", "--workdir", str(workdir), *variant],
                       cwd=REPO, capture_output=True, text=True, timeout=1500, check=False)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    steps = {s["check"]: s for s in json.loads((workdir / "acceptance.json").read_text())}
    for name in ("SGLang parses the shipped-bf16kv command", "SGLang parses the shipped-fp8kv command",
                 "SGLang parses the candidate command", "qverify capacity plans the served build", "gate call matches the CLI"):
        assert steps[name]["status"] == "ok", steps[name]
    assert "spec EAGLE3/compressed-tensors" in steps["SGLang parses the candidate command"]["detail"]
    if variant:
        assert "attention trtllm_mla" in steps["SGLang parses the candidate command"]["detail"]
        assert "tp 4" in steps["SGLang parses the candidate command"]["detail"]


def test_a_flag_sglang_rejects_fails_the_dry_run():
    """What the old script's plain --cuda-graph-max-bs would have done (ambiguous in SGLang 0.5.23)."""
    pytest.importorskip("sglang")
    import benchmarks.gpu.sglang_acceptance as acc

    with pytest.raises(SystemExit, match="SGLang rejects"):
        acc.parse_with_sglang(["python", "-m", "sglang.launch_server", "--model-path", "m", "--cuda-graph-max-bs", "16"])


def test_a_gate_flag_the_cli_lacks_fails_the_dry_run(workdir, monkeypatch):
    """What the old script's `gate --n-boot 500` would have done: the flag is checked against `qverify gate --help`."""
    import benchmarks.gpu.sglang_acceptance as acc

    monkeypatch.setattr(acc, "GATE", [*acc.GATE, "--n-boot", "500"])
    run = acc.Run(acc.argparse.Namespace(dry_run=True, workdir=str(workdir), port=1, tp=1, sm100=False, limit=2, replicates=1,
                                         ready_timeout=1.0))
    assert acc.unknown_gate_flags(run, False) == ["--n-boot"]
    monkeypatch.setattr(acc, "GATE", acc.GATE[:-2])
    assert acc.unknown_gate_flags(run, False) == []
