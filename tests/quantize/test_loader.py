"""The serving loader: exact weights, exact baseline logits, the quantization toggle, tamper refusal.

The routed-expert checks are the regression test for the measured hazard: plain
`from_pretrained` random-initialises the routed experts of MoE compressed-tensors builds
(or raises IndexError for KV-only builds), so these tests fail if the loader regresses.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from qverify.quantize import load_build, verify_build
from qverify.quantize.manifest import IntegrityError

LOSSY = ["fp8kv", "nvfp4shared", "fp8kv_nvfp4shared", "nvfp4_all", "fp8kv_badscale"]


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits.float()


@pytest.fixture(scope="module")
def baseline(source_model, probe_ids):
    return _logits(source_model, probe_ids)


@pytest.fixture(scope="module")
def loaded(built):
    cache = {}

    def get(recipe):
        if recipe not in cache:
            cache[recipe] = load_build(built(recipe).build_dir)
        return cache[recipe]

    return get


def test_bf16_logits_equal_the_source(loaded, probe_ids, baseline):
    assert torch.equal(_logits(loaded("bf16").model, probe_ids), baseline)


@pytest.mark.parametrize("recipe", LOSSY)
def test_lossy_logits_differ(loaded, probe_ids, baseline, recipe):
    lb = loaded(recipe)
    assert lb.quantization_enabled
    assert not torch.equal(_logits(lb.model, probe_ids), baseline)


@pytest.mark.parametrize("recipe", ["fp8kv", "fp8kv_badscale"])
def test_kv_only_builds_return_exactly_to_baseline_with_quantization_off(loaded, probe_ids, baseline, recipe):
    lb = loaded(recipe)
    lb.set_quantization_enabled(False)
    try:
        assert torch.equal(_logits(lb.model, probe_ids), baseline)
    finally:
        lb.set_quantization_enabled(True)
    assert not torch.equal(_logits(lb.model, probe_ids), baseline)


def test_toggle_on_weight_quantized_build_removes_activation_rounding(loaded, probe_ids):
    lb = loaded("nvfp4shared")
    on = _logits(lb.model, probe_ids)
    lb.quantization_enabled = False
    off = _logits(lb.model, probe_ids)
    lb.quantization_enabled = True
    assert not torch.equal(on, off) and torch.equal(_logits(lb.model, probe_ids), on)


@pytest.mark.parametrize("recipe", ["fp8kv", "nvfp4shared", "fp8kv_nvfp4shared"])
def test_routed_experts_are_the_source_weights(loaded, source_model, recipe):
    model = loaded(recipe).model
    for i in (1, 2):
        src, got = source_model.model.layers[i].mlp.experts, model.model.layers[i].mlp.experts
        assert torch.equal(got.gate_up_proj, src.gate_up_proj), f"layer {i} gate_up_proj not the checkpoint's"
        assert torch.equal(got.down_proj, src.down_proj), f"layer {i} down_proj not the checkpoint's"


def test_quantized_routed_experts_are_loaded_not_random(loaded, source_model):
    """nvfp4_all: experts are NVFP4 (linearized); dequantized they must be near the source, not random."""
    lb = loaded("nvfp4_all")
    assert lb.checks["target"].mode == "linearized"
    src = source_model.model.layers[1].mlp.experts.gate_up_proj[3, : source_model.config.moe_intermediate_size].float()
    got = lb.model.model.layers[1].mlp.experts[3].gate_proj.weight.float()
    rel = ((got - src).norm() / src.norm()).item()
    assert 0 < rel < 0.25, rel  # random re-initialisation gives ~1.4


def test_drafters_load(loaded, source_model):
    assert loaded("bf16").drafter is not None
    fp8 = loaded("fp8drafter").drafter
    q = fp8.model.layers[0].self_attn.q_proj
    assert q.quantization_scheme.weights.num_bits == 8 and loaded("fp8drafter").checks["drafter"].quantized


def test_plain_from_pretrained_hazard_is_caught_by_the_check(built):
    """Canary: the integrity check rejects what plain from_pretrained loads for an NVFP4-shared build.

    If this starts failing, transformers fixed the hazard and the workaround in
    qverify/quantize/checkpoint.py may be revisited.
    """
    from transformers import AutoModelForCausalLM

    from qverify.quantize.checkpoint import _iter_shards, compare_to_checkpoint

    d = built("nvfp4shared").build_dir
    plain = AutoModelForCausalLM.from_pretrained(d, dtype="auto")
    with pytest.raises(IntegrityError):
        compare_to_checkpoint(plain, {k: v for shard, _ in _iter_shards(d) for k, v in shard.items()}, "transformers", d)


# --------------------------------------------------------------------------- tampering


@pytest.fixture
def copy_of(built, tmp_path):
    def make(recipe):
        dst = tmp_path / recipe
        shutil.copytree(built(recipe).build_dir, dst)
        return dst

    return make


def _flip_byte_in(path, tensor):
    from qverify.quantize.manifest import safetensors_header

    header, base = safetensors_header(path)
    start = base + header[tensor]["data_offsets"][0]
    data = bytearray(path.read_bytes())
    data[start] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_build_reports_what_it_checked(built):
    r = verify_build(built("fp8kv_nvfp4shared_fp8drafter").build_dir)
    assert r.ok and r.kv_cache_quantized and r.drafter_load == "transformers"
    assert r.hashed == len(built("fp8kv_nvfp4shared_fp8drafter").manifest.tensor_hashes)


def test_tampered_tensor_is_refused(copy_of):
    d = copy_of("nvfp4shared")
    _flip_byte_in(d / "model.safetensors", "model.layers.1.mlp.experts.2.up_proj.weight")
    with pytest.raises(IntegrityError, match=r"model.safetensors::model.layers.1.mlp.experts.2.up_proj.weight does not match"):
        load_build(d)


def test_truncated_file_is_refused(copy_of):
    d = copy_of("fp8drafter")
    p = d / "drafter" / "model.safetensors"
    p.write_bytes(p.read_bytes()[: p.stat().st_size // 2])
    with pytest.raises(IntegrityError, match="truncated"):
        verify_build(d)


def test_edited_config_is_refused(copy_of):
    d = copy_of("fp8kv")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["kv_cache_scheme"] = None
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(IntegrityError, match=r"config.json::\* does not match"):
        verify_build(d)


def test_missing_manifest_or_extra_file_is_refused(copy_of):
    d = copy_of("bf16")
    (d / "extra.safetensors").write_bytes((d / "model.safetensors").read_bytes())
    with pytest.raises(IntegrityError, match="not in build.json"):
        verify_build(d)
    (d / "build.json").unlink()
    with pytest.raises(IntegrityError, match="no build.json"):
        verify_build(d)


def test_reload_check_catches_a_missing_tensor_even_with_consistent_hashes(copy_of):
    """A checkpoint short of one expert tensor whose build.json was rewritten to match: the load check refuses it."""
    from safetensors.torch import load_file, save_file

    from qverify.models import BuildManifest
    from qverify.quantize.manifest import hash_dir

    d = copy_of("bf16")
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.2.mlp.experts.5.up_proj.weight"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    m = BuildManifest.model_validate_json((d / "build.json").read_text())
    m.tensor_hashes = hash_dir(d)
    (d / "build.json").write_text(m.model_dump_json())
    with pytest.raises(IntegrityError, match="experts"):
        load_build(d)
