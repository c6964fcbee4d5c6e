"""qverify's FP8 KV scales against SGLang 0.5.23's own loader code (cut from its installed source: its modules
do not import on CPU, see tests/sglang_ref/sglang_source.py), on real builds of the Kimi-shaped checkpoint."""

from __future__ import annotations

import torch

from tests.sglang_ref.sglang_source import kv_cache_process_weights, kv_scale_remap

LAYERS = 3


def _sglang_params() -> dict[str, object]:
    """The KV-scale parameters SGLang's DeepseekV2AttentionMLA registers (RadixAttention attn_mqa / attn_mha)."""
    return {f"model.layers.{i}.self_attn.{a}.{s}": None for i in range(LAYERS) for a in ("attn_mqa", "attn_mha")
            for s in ("k_scale", "v_scale")}


def _build_scales(build_dir) -> dict[str, float]:
    from safetensors import safe_open

    from qverify.quantize.shards import weight_map

    out = {}
    for name, shard in weight_map(build_dir).items():
        if name.endswith("_scale") and "self_attn" in name and "proj.weight" not in name and "_proj.weight_" not in name:
            with safe_open(build_dir / shard, "pt") as f:
                out[name] = f.get_tensor(name).float().item()
    return out


def _what_sglang_loads(build_dir) -> dict[str, float]:
    remap, params = kv_scale_remap(), _sglang_params()
    loaded = {}
    for name, value in _build_scales(build_dir).items():
        if (target := remap(name, params)) is not None:
            assert target not in loaded, f"two checkpoint tensors load into {target}"
            loaded[target] = value
    return loaded


def _scales_used(k_loaded: float) -> tuple[float, float]:
    """SGLang's BaseKVCacheMethod.process_weights_after_loading on a layer whose k_scale was loaded and v_scale left
    at its creation value -1.0 (BaseKVCacheMethod.create_weights)."""
    scope = {"is_fp8_fnuz": lambda: False, "torch": torch}
    exec(kv_cache_process_weights(), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source

    class Layer:
        k_scale = torch.nn.Parameter(torch.tensor(k_loaded), requires_grad=False)
        v_scale = torch.nn.Parameter(torch.tensor(-1.0), requires_grad=False)

    layer = Layer()
    scope["process_weights_after_loading"](None, layer)
    return layer.k_scale_float, layer.v_scale_float


def test_compressed_tensors_names_alone_are_dropped_by_sglang():
    remap, params = kv_scale_remap(), _sglang_params()
    assert remap("model.layers.1.self_attn.k_scale", params) is None  # logged "not found in params_dict", skipped
    assert remap("model.layers.1.self_attn.v_scale", params) is None


def test_the_production_candidate_gives_sglang_scale_one(kimi_built):
    """SGLang loads no KV scale from the build, so every MLA attention keeps k_scale_float = v_scale_float = 1.0
    (BaseKVCacheMethod.create_weights' -1.0, turned into 1.0 by process_weights_after_loading): the plain-cast
    latent is read unscaled by every backend (docs/serve.md, 'FP8 KV on SGLang')."""
    d = kimi_built("fp8kv_nvfp4shared").build_dir
    assert any(n.endswith("self_attn.k_scale") for n in _build_scales(d))  # compressed-tensors' pair (1.0) is still there
    assert _what_sglang_loads(d) == {}
    assert _scales_used(-1.0) == (1.0, 1.0)


def test_badscale_reaches_sglang_as_its_declared_k_scale(kimi_built):
    loaded = _what_sglang_loads(kimi_built("fp8kv_badscale").build_dir)
    assert loaded == {f"model.layers.{i}.self_attn.attn_mqa.k_scale": 0.25 for i in range(LAYERS)}
    assert _scales_used(0.25) == (0.25, 0.25)  # k_scale_float: what trtllm_mla multiplies decode logits by
