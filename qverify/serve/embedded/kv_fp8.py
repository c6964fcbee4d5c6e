"""FP8 e4m3 latent KV as production stores it: one scale per layer over the whole 576-value latent.

SGLang 0.5.23's MLA backends quantize the cached latent (512 compressed KV after kv_a_layernorm, then the 64-value
rope key after rope) with ONE per-layer scale, the one its DeepSeek loader maps from `sglang_kv_scale_name(layer)`,
and 1.0 when none was loaded (qverify/quantize/kv_scales.py has the contract and its sources). So the engine uses,
per layer: that tensor when the build carries it; else `production_kv_scale(k_scale, v_scale)` from
compressed-tensors' pair (what a build made for SGLang carries under that name); else 1.0.

`mode="compressed-tensors"` applies compressed-tensors' own pair instead (k_scale on the 512 latent, v_scale on the
64 rope key), which is what HF + compressed-tensors computes: tests use it to hold the rest of the FP8 path to
compressed-tensors' forward.

Values are rounded through float8_e4m3fn (clamped to +-448) and kept in fp32: the CPU has no fp8 matmul, so storing
bytes would mean a dequantize of the whole cache per step, for the very same values.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import torch

from qverify.quantize.kv_scales import FP8_E4M3_MAX, production_kv_scale, sglang_kv_scale_name

ScaleMode = Literal["production", "compressed-tensors"]


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


def sglang_scales_in_checkpoint(build_dir: Path | str, n_layers: int) -> dict[int, float]:
    """The per-layer scales stored under SGLang's name in a build's safetensors (empty when the build has none)."""
    from safetensors import safe_open

    wanted = {sglang_kv_scale_name(i): i for i in range(n_layers)}
    out: dict[int, float] = {}
    for f in sorted(Path(build_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                if k in wanted:
                    out[wanted[k]] = float(st.get_tensor(k).float().reshape(-1)[0])
    return out


def _param(module: torch.nn.Module, name: str) -> float | None:
    t = getattr(module, name, None)
    return float(t.detach().float().reshape(-1)[0]) if isinstance(t, torch.Tensor) else None


def latent_scale(attn: torch.nn.Module, layer: int, kv_lora_rank: int, rope_dim: int, mode: ScaleMode = "production",
                 sglang_scales: dict[int, float] | None = None) -> torch.Tensor:
    """The scale applied to each of the layer's latent values, shape [kv_lora_rank + rope_dim] (fp32)."""
    k, v = _param(attn, "k_scale"), _param(attn, "v_scale")
    if mode == "compressed-tensors":
        return torch.cat([torch.full((kv_lora_rank,), k if k is not None else 1.0),
                          torch.full((rope_dim,), v if v is not None else 1.0)])
    s = (sglang_scales or {}).get(layer)
    if s is None:
        s = production_kv_scale(k, v)
    return torch.full((kv_lora_rank + rope_dim,), s)


def kv_quant_enabled(attn: torch.nn.Module) -> bool:
    """compressed-tensors put a KV scheme on this attention and quantization is switched on."""
    scheme = getattr(attn, "quantization_scheme", None)
    return scheme is not None and scheme.input_activations is not None and getattr(attn, "quantization_enabled", True)
