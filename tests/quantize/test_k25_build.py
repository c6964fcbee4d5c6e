"""Builds of Kimi K2.6 as released (the kimi_k25 wrapper, tests/fixtures/kimi_k25.py): real llm-compressor, real
safetensors. Both production commands build and verify; the wrapper, every name, the INT4 experts, the vision
tensors and the non-weight files come through as shipped; a wrapper qverify cannot build is refused up front."""

from __future__ import annotations

import json
import shutil

import pytest

from qverify.errors import BadInput
from tests.quantize.conftest import KIMI_CALIB

RECIPES = ("as_shipped", "fp8kv_nvfp4shared")


def _tensors(d) -> dict[str, str]:
    from qverify.quantize.manifest import hash_dir

    return {k.split("::", 1)[1]: v for k, v in hash_dir(d, tensors_only=True).items()}


@pytest.mark.parametrize("recipe", RECIPES)
def test_builds_and_verifies_as_a_wrapper(k25_built, kimi_k25, recipe):
    res = k25_built(recipe)
    assert res.verify.ok and res.verify.target_load == "streamed" and res.manifest.trust_remote_code
    src, out = (json.loads((d / "config.json").read_text()) for d in (kimi_k25, res.build_dir))
    assert out["model_type"] == "kimi_k25" and out["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert out["text_config"] == src["text_config"] and out["vision_config"] == src["vision_config"]
    qc = out["quantization_config"]  # top level: where SGLang's ModelConfig reads a wrapper's
    assert qc["config_groups"]["group_0"] == src["quantization_config"]["config_groups"]["group_0"]
    if recipe == "as_shipped":
        assert qc == src["quantization_config"] and res.manifest.quantization == []
    else:
        assert qc["config_groups"]["recipe_group_0"]["targets"] == ["re:.*shared_experts.*"]
        assert qc["kv_cache_scheme"]["num_bits"] == 8 and not any("shared_experts" in m for m in qc["ignore"])
        assert {q.scheme: q.modules for q in res.manifest.quantization} == {"NVFP4": 6, "kv_cache:fp8_e4m3": 3}


def test_baseline_is_the_release_byte_for_byte(k25_built, kimi_k25):
    from qverify.quantize.manifest import hash_dir

    out = hash_dir(k25_built("as_shipped").build_dir)
    assert hash_dir(kimi_k25) == {k: v for k, v in out.items() if not k.startswith("recipe.yaml")}


def test_candidate_keeps_every_name_int4_vision_and_files(k25_built, kimi_k25):
    res = k25_built("fp8kv_nvfp4shared")
    src, out = _tensors(kimi_k25), _tensors(res.build_dir)
    replaced = {n for n in src if ".shared_experts." in n and ".layers.0." not in n}  # NVFP4 now: weight -> packed
    assert len(replaced) == 6 and all(n.endswith(".weight") for n in replaced)
    assert {n: out.get(n) for n in src if n not in replaced} == {n: v for n, v in src.items() if n not in replaced}
    assert any(".mlp.experts." in n and n.endswith("weight_packed") for n in src)  # INT4 experts, byte for byte
    assert sum(n.startswith(("vision_tower.", "mm_projector.")) for n in out) == 7
    assert all(n.startswith(("language_model.model.", "language_model.lm_head.", "vision_tower.", "mm_projector."))
               for n in out), sorted(out)
    new = set(out) - set(src)
    assert any(n.endswith("shared_experts.up_proj.weight_packed") for n in new)
    assert all(n.startswith("language_model.model.layers.") for n in new)
    for name in ("preprocessor_config.json", "tiktoken.model", "tokenization_kimi.py", "chat_template.jinja",
                 "README.md", "tokenizer_config.json"):
        assert (res.build_dir / name).read_bytes() == (kimi_k25 / name).read_bytes(), name


def test_kv_scale_names_keep_the_wrapper_prefix(k25_built):
    """The compressed-tensors pair (1.0, not calibrated) keeps the wrapper's `language_model.` names; SGLang sees no MLA scale in the production
    candidate (issue 28), and the name it would load is recognised under the prefix (so a stray one is refused)."""
    from qverify.quantize.kv_scales import is_sglang_kv_scale

    names = _tensors(k25_built("fp8kv_nvfp4shared").build_dir)
    assert not any(is_sglang_kv_scale(n) for n in names)
    pair = sorted(n for n in names if n.endswith(("self_attn.k_scale", "self_attn.v_scale")))
    assert pair and all(n.startswith("language_model.model.layers.") for n in pair)
    assert is_sglang_kv_scale("language_model.model.layers.2.self_attn.k_proj.k_scale")  # SGLang's kimi_k25.py strips the prefix


def test_layerwise_model_computes_what_the_fully_dequantized_one_does(kimi_k25):
    """The hook that dequantizes one layer at a time gives the same logits as dequantizing every expert up front."""
    import torch
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from qverify.quantize.layerwise import _text_config, load_layerwise
    from qverify.quantize.layout import read_layout
    from qverify.quantize.shards import weight_map
    from qverify.quantize.shipped import dequantize, read_shipped

    cfg = json.loads((kimi_k25 / "config.json").read_text())
    layout, shipped = read_layout(kimi_k25, cfg, list(weight_map(kimi_k25))), read_shipped(kimi_k25, cfg)
    state = {}
    for p in sorted(kimi_k25.glob("*.safetensors")):
        state |= {layout.text_name(k): v for k, v in load_file(p).items() if layout.text_name(k) is not None}
    for module, names in shipped.modules.items():
        text = layout.text_name(module)
        parts = {n.rsplit(".", 1)[1]: state.pop(layout.text_name(n)) for n in names}
        state[f"{text}.weight"] = dequantize(module, parts, shipped.config, torch.bfloat16)
    ref = AutoModelForCausalLM.from_config(_text_config(layout), dtype=torch.bfloat16)
    linearize_moe(ref)
    ref.load_state_dict(state, strict=True)
    model, onloader = load_layerwise(kimi_k25, layout, shipped)
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref.eval()(ids).logits)
    assert onloader.current == 2  # the last MoE layer is the only one held
    onloader.close()


def _wrapper_copy(kimi_k25, tmp_path, edit_config=None, rename=None):
    from safetensors.torch import load_file, save_file

    d = tmp_path / "k25"
    shutil.copytree(kimi_k25, d)
    cfg = json.loads((d / "config.json").read_text())
    if edit_config:
        edit_config(cfg)
    (d / "config.json").write_text(json.dumps(cfg))
    if rename:
        (d / "model.safetensors.index.json").unlink()
        for p in d.glob("*.safetensors"):
            save_file({rename(k): v for k, v in load_file(p).items()}, p)
    return d


@pytest.mark.parametrize("case", ["text-not-deepseek", "nvidia-names"])
def test_wrapper_it_cannot_build_is_refused_before_hashing(kimi_k25, tmp_path, monkeypatch, case):
    import qverify.quantize.manifest as mf
    from qverify.quantize import build

    if case == "text-not-deepseek":
        d = _wrapper_copy(kimi_k25, tmp_path, lambda c: c["text_config"].update(model_type="qwen3", architectures=["Qwen3ForCausalLM"]))
        match = "around a 'qwen3' text model"
    else:  # nvidia/Kimi-K2.5-NVFP4 names its layers language_model.layers.*
        d = _wrapper_copy(kimi_k25, tmp_path, rename=lambda k: k.replace("language_model.model.layers.", "language_model.layers."))
        match = "not under language_model.model.layers. .*found prefixes: language_model.layers"
    monkeypatch.setattr(mf, "model_hash", lambda *a: pytest.fail("hashed before refusing"))
    with pytest.raises(BadInput, match=match) as e:
        build("as_shipped", model=d, workdir=tmp_path / "wd", trust_remote_code=True)
    assert "kimi_k25" in str(e.value) and not (tmp_path / "wd" / "builds").exists()


def test_a_failed_build_leaves_nothing_behind(kimi_k25, tmp_path, monkeypatch):
    import qverify.quantize.streamcopy as sc
    from qverify.quantize import build

    def broken(*a, **k):
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(sc, "copy_shard", broken)
    with pytest.raises(OSError):
        build("as_shipped", model=kimi_k25, workdir=tmp_path / "wd", trust_remote_code=True)
    assert not any((tmp_path / "wd" / "builds").iterdir())


def test_verify_build_catches_a_tampered_recipe_tensor(k25_built, tmp_path):
    from safetensors.torch import load_file, save_file

    from qverify.quantize.loader import verify_build
    from qverify.quantize.manifest import IntegrityError
    from qverify.quantize.shipped_build import RECIPE_SHARD

    d = tmp_path / "b"
    shutil.copytree(k25_built("fp8kv_nvfp4shared").build_dir, d)
    assert verify_build(d, trust_remote_code=True).ok
    t = load_file(d / RECIPE_SHARD)
    name = next(k for k in t if k.endswith("weight_packed"))
    t[name] = t[name].flip(0)
    save_file(t, d / RECIPE_SHARD)
    with pytest.raises(IntegrityError, match="does not match its hash"):
        verify_build(d, trust_remote_code=True)


def test_capacity_reads_the_wrapper_config(kimi_k25):
    """The shipped kimi-k2.6 config is the release's wrapper (no hand-flattened copy), and planning it gives what its
    text model alone gives; a kimi_k25 checkpoint dir plans the same way."""
    from qverify.capacity.planner import plan
    from qverify.capacity.sources import load_config

    cfg, _ = load_config("kimi-k2.6")
    assert cfg["model_type"] == "kimi_k25" and cfg["text_config"]["n_routed_experts"] == 384
    flat = cfg["text_config"] | {"quantization_config": cfg["quantization_config"], "vision_config": cfg["vision_config"]}
    for quant in ("as_shipped", "fp8kv_nvfp4shared"):
        # at a given fraction: SGLang's own default differs by architecture (a KimiK25ForConditionalGeneration keeps
        # its MLA prefill graph, a flat DeepseekV3ForCausalLM on trtllm_mla does not; capacity/sglang_default.py)
        a, b = (plan(c, quant, gpu="b200", tp=8, model_name="k2.6", mem_fraction=0.85) for c in (cfg, flat))
        assert a.model_dump() == b.model_dump()
    local, _ = load_config(str(kimi_k25))
    assert plan(local, "as_shipped", gpu="b200").weights.total_bytes > 0


def test_calibration_renders_through_the_releases_chat_template(kimi_k25, k25_built, tmp_path):
    """The calibration conversations go through the source's own chat_template.jinja (what the served model sees):
    qverify's template renders the same bytes as its built-in format; a release's other template changes the texts,
    and with them the calibration fingerprint and the build id."""
    from qverify.quantize import build
    from qverify.quantize.calibration import load_calibration, source_chat_template

    own = source_chat_template(kimi_k25)
    assert own is not None
    assert load_calibration("mix", 6, 64, own).texts == load_calibration("mix", 6, 64).texts
    marked = "<|release|>" + own
    texts = load_calibration("mix", 6, 64, marked).texts
    assert all(t.startswith("<|release|>") for t in texts)
    d = _wrapper_copy(kimi_k25, tmp_path)
    (d / "chat_template.jinja").write_text(marked)
    res = build("fp8kv_nvfp4shared", model=d, workdir=tmp_path / "wd", trust_remote_code=True, **KIMI_CALIB)
    base = k25_built("fp8kv_nvfp4shared").manifest
    assert res.manifest.calibration["fingerprint"] != base.calibration["fingerprint"]
    assert res.manifest.build_id != base.build_id and res.verify.ok
