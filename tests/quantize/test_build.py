"""Every built-in recipe builds the tiny model on CPU, verifies, and says exactly what it quantized."""

from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from qverify.quantize.manifest import model_hash
from qverify.quantize.recipe import list_recipes

RECIPES = [r.recipe.name for r in list_recipes()]
FP8_KV = {"fp8kv", "fp8kv_nvfp4shared", "fp8kv_nvfp4shared_fp8drafter", "fp8kv_badscale"}


def _config(d):
    return json.loads((d / "config.json").read_text())


def _keys(d):
    with safe_open(d / "model.safetensors", "pt") as f:
        return set(f.keys())


def _source_tensor_hashes(tiny_model):
    return {k.split("::", 1)[1]: v for k, v in model_hash(tiny_model)[1].items()}


def _build_tensor_hashes(manifest, prefix="model.safetensors::"):
    return {k[len(prefix):]: v for k, v in manifest.tensor_hashes.items() if k.startswith(prefix)}


def _unchanged(build_dir, source_dir, keys) -> list[str]:
    """Keys whose values differ from the source (the fp32 router bias is an exact upcast of the bf16 one)."""
    import torch
    from safetensors.torch import load_file

    b, s = load_file(build_dir / "model.safetensors"), load_file(source_dir / "model.safetensors")
    return [k for k in keys if not (k in b and torch.equal(b[k].to(s[k].dtype), s[k]) and torch.equal(s[k].to(b[k].dtype), b[k]))]


@pytest.mark.parametrize("recipe", RECIPES)
def test_recipe_builds_verifies_and_records_manifest(built, recipe, tiny_model):
    res = built(recipe)
    d, m = res.build_dir, res.manifest
    assert res.verify is not None and res.verify.ok and res.verify.compared > 50
    assert d.name == m.build_id and m.build_id.startswith(recipe + "-")
    for f in ("build.json", "config.json", "model.safetensors", "tokenizer.json", "recipe.yaml", "drafter/config.json"):
        assert (d / f).is_file(), f
    assert m.recipe == recipe and m.source_model == str(tiny_model) and m.drafter == str(tiny_model / "drafter")
    assert set(m.versions) >= {"torch", "transformers", "llmcompressor", "compressed-tensors"}
    assert m.kv_dtype == ("fp8_e4m3" if recipe in FP8_KV else "bf16")
    assert m.kv_bytes_per_token == 3 * (512 + 64) * (1 if recipe in FP8_KV else 2)
    assert any(k.startswith("drafter/model.safetensors::") for k in m.tensor_hashes)
    assert m.total_bytes == sum(m.bytes_by_dtype.values()) > 0
    assert m.control == (recipe in {"nvfp4_all", "fp8kv_badscale", "noise_shared"})
    assert bool(m.calibration) == (recipe not in ("bf16", "as_shipped", "noise_shared"))  # the dial adds noise, calibrates nothing
    assert not [p for p in d.parent.iterdir() if ".tmp-" in p.name]


def test_bf16_is_the_source_bit_for_bit(built, tiny_model):
    d = built("bf16").build_dir
    assert "quantization_config" not in _config(d) and not built("bf16").manifest.quantization
    assert _build_tensor_hashes(built("bf16").manifest) == _source_tensor_hashes(tiny_model)


def test_fp8kv_adds_static_scales_and_touches_no_weight(built, tiny_model):
    res = built("fp8kv")
    qc = _config(res.build_dir)["quantization_config"]
    assert qc["config_groups"] == {}
    kv = qc["kv_cache_scheme"]
    assert (kv["num_bits"], kv["type"], kv["strategy"], kv["dynamic"], kv["symmetric"], kv["observer"]) == \
        (8, "float", "tensor", False, True, "static_minmax")
    hashes = _build_tensor_hashes(res.manifest)
    scales = {k for k in hashes if k.endswith(("k_scale", "v_scale"))}
    assert len(scales) == 6  # k and v per layer
    assert set(hashes) - scales == set(_source_tensor_hashes(tiny_model))
    assert _unchanged(res.build_dir, tiny_model, set(hashes) - scales) == []


def test_nvfp4shared_quantizes_shared_experts_only(built, tiny_model):
    d = built("nvfp4shared").build_dir
    qc = _config(d)["quantization_config"]
    assert qc["kv_cache_scheme"] is None and len(qc["config_groups"]) == 1
    group = next(iter(qc["config_groups"].values()))
    assert group["format"] == "nvfp4-pack-quantized" and group["targets"] == ["re:.*shared_experts.*"]
    assert group["weights"]["num_bits"] == 4 and group["weights"]["group_size"] == 16 and group["input_activations"]
    keys, src = _keys(d), _source_tensor_hashes(tiny_model)
    packed = {k.rsplit(".", 1)[0] for k in keys if k.endswith("weight_packed")}
    assert packed and all(".shared_experts." in p for p in packed)
    assert len(packed) == 6  # gate/up/down in both MoE layers
    untouched = [k for k in src if ".shared_experts." not in k]
    assert _unchanged(d, tiny_model, untouched) == []  # every other Linear (and everything else) unchanged
    summary = built("nvfp4shared").manifest.quantization
    assert [(s.scheme, s.modules, s.format) for s in summary] == [("NVFP4", 6, "nvfp4-pack-quantized")]


def test_fp8kv_nvfp4shared_has_both(built):
    qc = _config(built("fp8kv_nvfp4shared").build_dir)["quantization_config"]
    assert qc["kv_cache_scheme"]["observer"] == "static_minmax"
    assert next(iter(qc["config_groups"].values()))["format"] == "nvfp4-pack-quantized"


@pytest.mark.parametrize("recipe, calibrated", [("fp8kv_nvfp4shared", [["re:.*shared_experts.*"]]), ("fp8kv", [])])
def test_fp8_kv_is_not_calibrated(tiny_model, monkeypatch, recipe, calibrated):
    """SGLang casts the MLA latent to FP8 with scale 1 and loads no calibrated pair, so no KV observer runs: oneshot
    sees only the NVFP4 shared experts (fp8kv: no oneshot at all) and the KV scheme lands with scale 1.0.
    Old code handed oneshot the recipe's kv_cache_scheme (K/V observed on every calibration token)."""
    import llmcompressor
    import torch

    from qverify.quantize import compress
    from qverify.quantize.recipe import load_recipe

    seen = []
    monkeypatch.setattr(llmcompressor, "oneshot", lambda **kw: seen.append(kw["recipe"]))
    model = compress.load_source(tiny_model)
    compress.quantize(model, load_recipe(recipe).recipe.target, [0], 8, "basic", recipe)
    mods = [m for r in seen for m in r.modifiers]
    assert not [m for m in mods if getattr(m, "kv_cache_scheme", None)]
    assert [m.targets for m in mods] == calibrated
    for layer in model.model.layers:
        assert torch.equal(layer.self_attn.k_scale.detach().float(), torch.ones_like(layer.self_attn.k_scale, dtype=torch.float))
        assert torch.equal(layer.self_attn.v_scale.detach().float(), torch.ones_like(layer.self_attn.v_scale, dtype=torch.float))


def test_fp8drafter_quantizes_the_drafter_only(built):
    res = built("fp8drafter")
    assert "quantization_config" not in _config(res.build_dir)
    qc = _config(res.build_dir / "drafter")["quantization_config"]
    group = next(iter(qc["config_groups"].values()))
    assert group["weights"]["num_bits"] == 8 and group["weights"]["type"] == "float"
    assert group["input_activations"]["dynamic"] is True and "lm_head" in qc["ignore"]
    with safe_open(res.build_dir / "drafter" / "model.safetensors", "pt") as f:
        assert str(f.get_slice("lm_head.weight").get_dtype()) == "BF16"
        assert str(f.get_slice("model.layers.0.self_attn.q_proj.weight").get_dtype()) == "F8_E4M3"
    assert [s.scheme for s in res.manifest.quantization] == ["drafter:FP8_DYNAMIC"]


def test_production_candidate_has_all_three(built):
    schemes = {s.scheme for s in built("fp8kv_nvfp4shared_fp8drafter").manifest.quantization}
    assert schemes == {"NVFP4", "kv_cache:fp8_e4m3", "drafter:FP8_DYNAMIC"}


def test_nvfp4_all_quantizes_every_linear_but_lm_head(built):
    d = built("nvfp4_all").build_dir
    keys = _keys(d)
    plain = {k.rsplit(".", 1)[0] for k in keys if k.endswith("proj.weight")}
    assert plain == set(), f"unquantized Linear weights left: {sorted(plain)[:3]}"
    assert any(".experts.0.gate_proj.weight_packed" in k for k in keys) and "lm_head.weight" in keys


def test_badscale_is_fp8kv_plus_a_scale_sglang_loads(built):
    """fp8kv carries no SGLang-visible MLA scale (SGLang casts its latent with scale 1); the control adds exactly its
    declared one, and both keep the same pair (1.0, not calibrated) under compressed-tensors' names (which SGLang skips)."""
    import torch

    from qverify.quantize.kv_scales import sglang_scales_in_dir

    def pair(name):
        with safe_open(built(name).build_dir / "model.safetensors", "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if k.endswith(("self_attn.k_scale", "self_attn.v_scale"))}  # noqa: SIM118

    good, bad = pair("fp8kv"), pair("fp8kv_badscale")
    assert set(good) == set(bad) and all(torch.equal(good[k], bad[k]) for k in good)
    assert sglang_scales_in_dir(built("fp8kv").build_dir) == {}
    layers = len(good) // 2
    assert sglang_scales_in_dir(built("fp8kv_badscale").build_dir) == {f"model.layers.{i}.self_attn.k_proj.k_scale": 0.25 for i in range(layers)}
    assert built("fp8kv").manifest.kv_scales["sglang_k_scale"] == 1.0
    assert built("fp8kv_badscale").manifest.kv_scales["sglang_k_scale"] == 0.25


def test_same_inputs_same_id_and_reuse(built, tiny_model, workdir):
    from qverify.quantize import build

    first = built("fp8kv")
    again = build("fp8kv", model=tiny_model, workdir=workdir, calib_samples=16, calib_seq_len=128)
    assert again.reused and again.build_dir == first.build_dir and again.manifest.build_id == first.manifest.build_id
    base = built("bf16")
    other = build("bf16", model=tiny_model, workdir=workdir, calib_samples=99)  # calibration unused: same id
    assert other.reused and other.manifest.build_id == base.manifest.build_id
    forced = build("bf16", model=tiny_model, workdir=workdir, force=True)
    assert not forced.reused and forced.manifest.build_id == built("bf16").manifest.build_id
