"""FP8 e4m3 latent KV as SGLang 0.5.23's MLA backends compute it (docs/serve.md, "FP8 KV on SGLang", has the table
with the SGLang functions each line comes from).

What every backend shares: the cached latent (512 compressed KV after kv_a_layernorm, then the 64-value rope key
after rope) is a plain cast to FP8 with scale 1 (`MLATokenToKVPool._write_mla_kv_buffer`,
`mla_quantize_without_rope_for_fp8`), and a prompt's own prefill attention uses the unrounded values (MHA over
kv_b_proj of the fresh latent), except for a prefix it finds cached, which it reads back rounded (prefix_reads.py). Where the backends differ, the engine follows `attention_backend`:
- trtllm_mla (the SM100 default for DeepSeek/Kimi) and cutedsl_mla (its subclass): the absorbed decode/verify query
  is cast to FP8 too; decode/verify logits are multiplied by the k_scale SGLang loaded
  (`_compute_decode_bmm1_scale`: 1.0 unless the build carries an SGLang-visible scale, which only the badscale
  control does); prefill casts its MHA q, k, v to FP8 with attn_mha's scale 1 (`_quantize_fp8_qkv`);
- flashinfer: the cache is read back to bf16 unscaled (`get_key_buffer(...).to(q.dtype)`), query and prefill stay
  in the model dtype, no scale is read.
Other backends (fa3, triton) are not emulated for FP8 KV: the engine refuses them rather than guess.

`mode="compressed-tensors"` applies compressed-tensors' pair instead (k_scale on the 512 latent, v_scale on the 64
rope key, prefill over the rounded latent: HF + compressed-tensors' QuantizedKVCache); tests use it to hold the rest
of the FP8 path to compressed-tensors' forward.

Values are rounded through float8_e4m3fn (clamped to +-448; SGLang's plain `.to()` would give NaN beyond) and kept
in fp32: the CPU has no fp8 matmul, so storing bytes would mean a dequantize of the whole cache per step.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch

from qverify.errors import BadInput
from qverify.quantize.kv_scales import (
    DEFAULT_BACKEND,
    FP8_E4M3_MAX,
    SGLANG_FP8_PATHS,
    sglang_scale_layer,
    sglang_scales_in_dir,
)

ScaleMode = Literal["production", "compressed-tensors"]



@dataclass(frozen=True)
class LayerFp8:
    """How one layer computes with its FP8 latent cache."""

    cache_scale: torch.Tensor  # [C + dr] per-value scale of the cache write (ones on SGLang)
    prefill_from_cache: bool = False  # prefill expands the rounded latent (compressed-tensors) instead of the fresh one
    prefill_fp8: bool = False  # prefill's MHA q, k, v rounded through FP8 (scale 1)
    query_fp8: bool = False  # decode/verify absorbed query rounded through FP8 (scale 1)
    logit_scale: float = 1.0  # decode/verify attention logits multiplied by this (trtllm_mla's k_scale)
    # a prefill over a cached prefix (prefix_reads.py) takes its own new rows' K/V from their fresh latent (trtllm_mla
    # and cutedsl_mla: MHA_CHUNKED_KV); else every row, its own included, is the rounded latent (flashinfer)
    extend_fresh_tail: bool = False


def fp8_roundtrip(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Quantize to float8_e4m3fn and back, as compressed-tensors' fake quant does (x/scale, clamp, cast, *scale);
    x [N, W], scale [W] (or broadcastable). The engine's kernel does the same in one pass where it is built."""
    if x.dim() == 2 and x.dtype == scale.dtype == torch.float32 and scale.numel() == x.shape[1] and x.stride(1) == 1:
        from qverify.serve.embedded.mqa_kernel import load

        ext = load()
        if ext is not None:
            return ext.fp8_roundtrip(x, scale.reshape(-1), float(FP8_E4M3_MAX))
    q = (x / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn)
    return q.to(x.dtype) * scale


def fp8_cast(x: torch.Tensor) -> torch.Tensor:
    """A scale-1 FP8 round trip of any contiguous fp32 tensor over its last dim (SGLang's `.to(float8_e4m3fn)`)."""
    w = x.shape[-1]
    return fp8_roundtrip(x.reshape(-1, w), torch.ones(w)).view(x.shape)


def sglang_k_scales(build_dir: Path | str) -> dict[int, float]:
    """Per layer, the k_scale SGLang would use from the build's SGLang-visible tensors (none: empty). As
    BaseKVCacheMethod.process_weights_after_loading: k when loaded, else the v it duplicates."""
    found = sglang_scales_in_dir(build_dir)
    out: dict[int, float] = {}
    for name, value in sorted(found.items(), key=lambda kv: "k_scale" in kv[0]):  # k names last: they win
        if ".attn_mha." not in name:
            out[sglang_scale_layer(name)] = value
    return out


def check_backend(backend: str) -> None:
    if backend not in SGLANG_FP8_PATHS:
        raise BadInput(f"the embedded engine does not emulate SGLang's {backend!r} FP8 KV path",
                       fix=f"use one of {', '.join(SGLANG_FP8_PATHS)} (docs/serve.md, 'FP8 KV on SGLang')")


def _param(module: torch.nn.Module, name: str) -> float | None:
    t = getattr(module, name, None)
    return float(t.detach().float().reshape(-1)[0]) if isinstance(t, torch.Tensor) else None


def layer_fp8(attn: torch.nn.Module, layer: int, mode: ScaleMode = "production", backend: str = DEFAULT_BACKEND,
              sglang_scales: dict[int, float] | None = None) -> LayerFp8:
    C, dr = attn.kv_lora_rank, attn.qk_rope_head_dim
    if mode == "compressed-tensors":
        k, v = _param(attn, "k_scale"), _param(attn, "v_scale")
        scale = torch.cat([torch.full((C,), k if k is not None else 1.0), torch.full((dr,), v if v is not None else 1.0)])
        return LayerFp8(scale, prefill_from_cache=True)
    check_backend(backend)
    query_fp8, prefill_fp8, reads_k_scale = SGLANG_FP8_PATHS[backend]
    k_scale = (sglang_scales or {}).get(layer, 1.0) if reads_k_scale else 1.0
    return LayerFp8(torch.ones(C + dr), prefill_fp8=prefill_fp8, query_fp8=query_fp8, logit_scale=k_scale,
                    extend_fresh_tail=backend != "flashinfer")


def kv_quant_enabled(attn: torch.nn.Module) -> bool:
    """compressed-tensors put a KV scheme on this attention and quantization is switched on."""
    scheme = getattr(attn, "quantization_scheme", None)
    return scheme is not None and scheme.input_activations is not None and getattr(attn, "quantization_enabled", True)
