"""`qverify capacity` as a user runs it: a real subprocess, exit codes and --json output."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from qverify.models import BuildManifest

torch.set_num_threads(1)


def qv(*args: str, workdir: Path | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "qverify"] + (["--workdir", str(workdir)] if workdir else []) + list(args)
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def test_kimi_json_checks_the_article():
    r = qv("--json", "capacity", "--model-config", "kimi-k2.6", "--recipe", "fp8kv_nvfp4_experts", "--gpu", "b200", "--hbm-gb", "180", "--tp", "8",
           "--mem-fraction", "1", "--cuda-context-gb", "0", "--weights-gb", "595", "--context", "1m")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["kv_dtype"] == "fp8" and p["pre_model_load_bytes"] == 180 * 10**9 and p["slack_bytes"] == 0
    assert round(p["kv_tokens_per_replica"] / 1e6, 2) == 2.93 and p["sessions_at_context"] == 2  # not 3.0M: TP-replicated modules
    assert any("matches the FP8-KV figure" in n for n in p["notes"])


def test_profile_supplies_tp_and_mem_fraction():
    """The production profile's mem_fraction_static 0.85 on 4 B200s: about 3 sessions of 100k, not the 9 once documented."""
    r = qv("--json", "capacity", "--model-config", "kimi-k2.6", "--recipe", "fp8kv_nvfp4shared", "--profile", "kimi-k2.6", "--gpu", "b200")
    assert r.returncode == 0, r.stderr
    p = json.loads(r.stdout)
    assert p["tp"] == 4 and p["mem_fraction"] == 0.85 and p["mem_fraction_source"] == "profile kimi-k2.6"
    assert 290_000 <= p["kv_tokens_per_replica"] <= 350_000 and p["sessions_at_context"] == 3
    explicit = json.loads(qv("--json", "capacity", "--model-config", "kimi-k2.6", "--profile", "kimi-k2.6", "--tp", "8",
                             "--mem-fraction", "0.9").stdout)
    assert explicit["tp"] == 8 and explicit["mem_fraction"] == 0.9 and explicit["mem_fraction_source"] == "given"


def test_human_output_shows_assumptions_and_notes():
    r = qv("capacity", "--model-config", "kimi-k2.6", "--recipe", "nvfp4_experts", "--gpu", "b200", "--tp", "4")
    assert r.returncode == 0, r.stderr
    for text in ("KV tokens per replica", "Assumptions", "DP-attention off", "Notes", "routed_experts"):
        assert text in r.stdout
    # issue 36.2: no profile is SGLang's own default for the model (about 0.77 with its vision tower): no pool
    assert "does not fit: fits from mem_fraction_static 0.79" in r.stdout and "SGLang's default" in r.stdout
    served = qv("capacity", "--model-config", "kimi-k2.6", "--recipe", "fp8kv_nvfp4shared", "--profile", "kimi-k2.6")
    assert "3, 7,944 tokens to spare" in served.stdout and "25,975 fewer per GiB more CUDA context" in served.stdout
    # issue 38.6: assumptions and notes wrap under their own bullet, never into a line that reads as a bullet
    notes = served.stdout[served.stdout.index("Assumptions"):].splitlines()[1:]
    assert all(line.startswith(("  - ", "    ", "Notes")) and len(line) <= 80 for line in notes)


@pytest.fixture(scope="module")
def workdir_with_build(tmp_path_factory) -> tuple[Path, Path]:
    """A workdir holding one build: a tiny Llama checkpoint with a BuildManifest and a drafter."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    wd = tmp_path_factory.mktemp("wd")
    d = wd / "builds" / "b123"
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).save_pretrained(d)
    AutoModelForCausalLM.from_config(LlamaConfig(**{**cfg.to_dict(), "num_hidden_layers": 1}), dtype=torch.bfloat16) \
        .save_pretrained(d / "drafter")
    manifest = BuildManifest(build_id="b123", recipe="fp8kv", recipe_hash="h", recipe_text="", source_model="tiny",
                             source_hash="s", kv_dtype="fp8_e4m3")
    (d / "build.json").write_text(manifest.model_dump_json())
    return wd, d


def test_build_id_uses_checkpoint_bytes_and_manifest_kv_dtype(workdir_with_build):
    wd, d = workdir_with_build
    # the workdir's one resolver (issue 36.1: capacity took only an id or a directory): id, directory, prefix, recipe
    for target in ("b123", str(d), "b12", "fp8kv"):
        r = qv("--json", "capacity", target, "--gpu", "h100", workdir=wd)
        assert r.returncode == 0, r.stderr
        p = json.loads(r.stdout)
        assert p["model"] == "b123" and p["weights"]["source"] == "checkpoint" and p["kv_dtype"] == "fp8"
        assert p["drafter_weights_bytes"] > 0
        # GQA: target 2 layers + drafter 1 layer, each 2 x 2 kv_heads x 16 head_dim x 1 B (fp8)
        fp8 = next(o for o in p["kv"] if o["kv_dtype"] == "fp8")
        assert fp8["rank_bytes_per_token"] == (2 + 1) * 2 * 2 * 16
        assert p["kv_tokens_per_replica"] == p["free_per_gpu_bytes"] // fp8["rank_bytes_per_token"]


@pytest.mark.parametrize(("args", "message"), [
    (["capacity", "--gpu", "b200"], "exactly one of BUILD or --model-config"),
    (["capacity", "nope", "--model-config", "kimi-k2.6"], "exactly one of BUILD or --model-config"),
    (["capacity", "--model-config", "kimi-k2.6", "--gpu", "a100"], "unknown GPU 'a100'"),
    (["capacity", "--model-config", "kimi-k2.6", "--recipe", "fp8kv_nvfp4shard"], "did you mean 'fp8kv_nvfp4shared'"),
    (["capacity", "--model-config", "kimi-k2.6", "--context", "lots"], "--context 'lots' is not a token count"),
    (["capacity", "--model-config", "kimi-k2.6", "--tp", "0"], "--tp must be >= 1"),  # the CLI boundary (qverify/commands) rejects it first
    (["capacity", "--model-config", "kimi-k2.7"], "neither a file nor a shipped config"),
    (["capacity", "no-such-build"], "no build 'no-such-build'"),
    (["capacity", "b123", "--recipe", "fp8kv"], "--recipe applies only with --model-config"),
    (["capacity", "--model-config", "kimi-k2.6", "--tp", "four"], "error:"),
])
def test_bad_input_exits_4_with_one_line(workdir_with_build, capsys, args, message):
    # In-process through the real CLI entry point (a subprocess per case only adds start-up time)
    from qverify.cli import main

    assert main(["--workdir", str(workdir_with_build[0]), *args]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_malformed_config_json_exits_4(tmp_path):
    bad = tmp_path / "config.json"
    bad.write_text("{ not json")
    r = qv("capacity", "--model-config", str(bad))
    assert r.returncode == 4 and "is not valid JSON" in r.stderr
