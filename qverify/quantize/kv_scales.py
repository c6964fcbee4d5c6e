"""FP8 KV-cache scale names: what a build writes, what SGLang loads, what the embedded engine applies.

For MLA the cache holds one 576-value latent per token (512 compressed KV + 64 rope key).
- compressed-tensors (HF reference) writes two scales per layer: `self_attn.k_scale` (applied to the 512-value
  latent) and `self_attn.v_scale` (applied to the 64-value rope key).
- SGLang 0.5.23's DeepSeek loader renames only `self_attn.k_proj.k_scale` -> `self_attn.attn_mqa.k_scale` and skips
  unknown names; its MLA backends then quantize the whole 576-value latent with that ONE scale (1.0 if none loaded).
So a build meant for SGLang carries, besides compressed-tensors' pair, one production scale per layer covering the
whole latent: max(k_scale, v_scale) (both are amax/448 of their part, so the max is amax/448 of the whole latent).
(Field notes, "SGLang 0.5.23, read from its source"; the production-path issue verifies the name against SGLang.)
"""

from __future__ import annotations

FP8_E4M3_MAX = 448.0


def ct_kv_scale_names(layer: int) -> tuple[str, str]:
    """compressed-tensors' (k_scale, v_scale) tensor names for one decoder layer."""
    return (f"model.layers.{layer}.self_attn.k_scale", f"model.layers.{layer}.self_attn.v_scale")


def sglang_kv_scale_name(layer: int) -> str:
    """The tensor name SGLang 0.5.23's DeepSeek loader maps onto the MLA attention's single KV scale."""
    return f"model.layers.{layer}.self_attn.k_proj.k_scale"


def production_kv_scale(k_scale: float | None, v_scale: float | None) -> float:
    """The one scale SGLang applies to the 576-value latent, from compressed-tensors' pair (1.0 when absent)."""
    present = [s for s in (k_scale, v_scale) if s is not None]
    return float(max(present)) if present else 1.0
