"""FP8 KV-cache scale names: what a build writes, what SGLang loads, what the embedded engine applies.

For MLA the cache holds one 576-value latent per token (512 compressed KV + 64 rope key).
- compressed-tensors (HF reference) writes two scales per layer: `self_attn.k_scale` (applied to the 512-value
  latent) and `self_attn.v_scale` (applied to the 64-value rope key).
- SGLang 0.5.23's DeepSeek loader renames only `self_attn.k_proj.k_scale` -> `self_attn.attn_mqa.k_scale` and skips
  unknown names; its MLA backends then quantize the whole 576-value latent with that ONE scale (1.0 if none loaded).
So a build meant for SGLang carries, besides compressed-tensors' pair, one production scale per layer covering the
whole latent: max(k_scale, v_scale) (both are amax/448 of their part, so the max is amax/448 of the whole latent).
Confirmed against SGLang 0.5.23's code (tests/quantize/test_kv_scales_sglang.py runs it):
- srt/models/deepseek_common/deepseek_weight_loader.py, `DeepseekV2WeightLoaderMixin.do_load_weights`: a name with
  "k_scale"/"v_scale" that is not a parameter has `k_proj`/`v_proj` replaced by `attn_mqa`; anything still unknown
  is logged "not found in params_dict" and skipped (so compressed-tensors' `self_attn.k_scale` never loads).
- srt/layers/quantization/kv_cache.py, `BaseKVCacheMethod.process_weights_after_loading`: with only k_scale loaded
  it uses max(k_scale, v_scale) for both, i.e. our one scale.
- srt/layers/attention/trtllm_mla_backend.py / flashmla_backend.py: the MLA latent is (de)quantized with
  `layer.k_scale` / `k_scale_float` of `attn_mqa`.
"""

from __future__ import annotations

import re

# A wrapper checkpoint (kimi_k25) names its text model `language_model.model.layers.*`: the prefix is kept as is
# (SGLang's kimi_k25.py strips it before its DeepSeek loader renames the scale).
_SGLANG_NAME = re.compile(r"^((?:language_model\.)?)model\.layers\.(\d+)\.self_attn\.k_proj\.k_scale$")
_CT_NAME = re.compile(r"^((?:language_model\.)?)model\.layers\.(\d+)\.self_attn\.([kv])_scale$")

FP8_E4M3_MAX = 448.0


def ct_kv_scale_names(layer: int) -> tuple[str, str]:
    """compressed-tensors' (k_scale, v_scale) tensor names for one decoder layer."""
    return (f"model.layers.{layer}.self_attn.k_scale", f"model.layers.{layer}.self_attn.v_scale")


def sglang_kv_scale_name(layer: int, prefix: str = "") -> str:
    """The tensor name SGLang 0.5.23's DeepSeek loader maps onto the MLA attention's single KV scale."""
    return f"{prefix}model.layers.{layer}.self_attn.k_proj.k_scale"


def production_kv_scale(k_scale: float | None, v_scale: float | None) -> float:
    """The one scale SGLang applies to the 576-value latent, from compressed-tensors' pair (1.0 when absent)."""
    present = [s for s in (k_scale, v_scale) if s is not None]
    return float(max(present)) if present else 1.0


def is_sglang_kv_scale(name: str) -> bool:
    return bool(_SGLANG_NAME.match(name))


def production_scales(ct_scales: dict[str, float]) -> dict[str, float]:
    """{SGLang name: one scale} from compressed-tensors' {name: scale} pairs (any extra names ignored)."""
    pairs: dict[tuple[str, int], dict[str, float]] = {}
    for name, value in ct_scales.items():
        if m := _CT_NAME.match(name):
            pairs.setdefault((m[1], int(m[2])), {})[m[3]] = float(value)
    return {sglang_kv_scale_name(i, prefix): production_kv_scale(p.get("k"), p.get("v"))
            for (prefix, i), p in sorted(pairs.items())}


def check_production_scales(found: dict[str, float], ct_scales: dict[str, float], where: str) -> int:
    """Every layer with compressed-tensors scales carries the SGLang scale, equal to the max of its pair."""
    from qverify.quantize.manifest import IntegrityError

    expected = production_scales(ct_scales)
    for name, value in expected.items():
        if name not in found:
            raise IntegrityError(f"{where}: {name} is missing: SGLang would run this FP8 KV cache with scale 1.0",
                                 fix="rebuild it with --force (qverify writes the SGLang scale next to the pair)")
        if found[name] != value:
            raise IntegrityError(f"{where}: {name} = {found[name]} but its compressed-tensors pair gives {value}",
                                 fix="rebuild it with --force")
    extra = sorted(set(found) - set(expected))
    if extra:
        raise IntegrityError(f"{where}: {extra[0]} has no compressed-tensors pair", fix="rebuild it with --force")
    return len(found)


SGLANG_SCALES_SHARD = "model-sglang-kv-scales.safetensors"


def write_production_scales(build_dir) -> int:
    """Add SGLang's one scale per layer (max of the pair, same dtype) to a saved FP8-KV build; returns how many."""
    import torch
    from safetensors import safe_open

    from qverify.quantize.shards import add_shard, weight_map

    pairs: dict[str, torch.Tensor] = {}
    for name, shard in weight_map(build_dir).items():
        if _CT_NAME.match(name):
            with safe_open(build_dir / shard, "pt") as f:
                pairs[name] = f.get_tensor(name)
    if not pairs:
        return 0
    dtype = next(iter(pairs.values())).dtype
    values = production_scales({k: v.float().item() for k, v in pairs.items()})
    add_shard(build_dir, SGLANG_SCALES_SHARD, {k: torch.tensor(v, dtype=dtype).reshape(pairs[k.replace("k_proj.", "")].shape)
                                              for k, v in values.items()})
    return len(values)
