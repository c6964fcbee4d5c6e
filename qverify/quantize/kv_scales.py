"""FP8 KV-cache scales on MLA: what a build writes, what SGLang loads, what it does with it.

For MLA the cache holds one 576-value latent per token (512 compressed KV + 64 rope key).
- compressed-tensors (the HF reference; vLLM loads the same names) writes two calibrated scales per layer:
  `self_attn.k_scale` (on the 512-value latent) and `self_attn.v_scale` (on the 64-value rope key).
- SGLang 0.5.23 does not load those: `DeepseekV2WeightLoaderMixin.do_load_weights`
  (srt/models/deepseek_common/deepseek_weight_loader.py) only renames `self_attn.k_proj.k_scale` /
  `self_attn.v_proj.v_scale` onto `self_attn.attn_mqa.{k,v}_scale` and skips what is still unknown ("not found in
  params_dict"); tests/quantize/test_kv_scales_sglang.py runs that code.
- No SGLang MLA cache write applies a scale (plain casts: `MLATokenToKVPool._write_mla_kv_buffer`,
  `mla_quantize_without_rope_for_fp8`, `mla_quantize_and_rope_for_fp8` with quant_scale_kv=1.0), but trtllm_mla and
  cutedsl_mla (the SM100 default for DeepSeek/Kimi) multiply every decode and verify attention logit by the loaded
  k_scale (`TRTLLMMLABackend._compute_decode_bmm1_scale`). A loaded scale s != 1 therefore scales decode logits by s
  for K that was never divided by s (docs/serve.md, "FP8 KV on SGLang", has the per-backend table).
So a build for SGLang carries no SGLang-visible MLA scale (1.0 is tolerated: it changes nothing), and FP8 KV needs no
calibration: qverify applies the KV scheme data-free (compress.split_kv), so compressed-tensors' pair, which SGLang does
not load, is 1.0 too, and HF + compressed-tensors computes SGLang's plain cast; the manifest's `kv_scales` says so. Only a control (`corrupt.sglang_k_scale`, the fp8kv_badscale recipe) writes another
value under SGLang's name, and only the value its manifest declares is accepted.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

# every checkpoint name SGLang 0.5.23's DeepSeek/Kimi loader puts onto an MLA attention's KV scale (kimi_k25 strips
# `language_model.` first): the k_proj/v_proj names it renames, and the attention's own parameter names
_SGLANG_VISIBLE = re.compile(r"^(?:language_model\.)?model\.layers\.(\d+)\.self_attn\."
                             r"(?:k_proj\.k_scale|v_proj\.v_scale|attn_mqa\.[kv]_scale|attn_mha\.[kv]_scale)$")
_CT_NAME = re.compile(r"^(?:language_model\.)?model\.layers\.(\d+)\.self_attn\.([kv])_scale$")

FP8_E4M3_MAX = 448.0

# The SGLang MLA backends whose FP8-KV numerics the embedded engine emulates (serve/embedded/kv_fp8.py), as
# backend -> (decode/verify query cast to FP8, prefill q/k/v cast to FP8, decode/verify logits x loaded k_scale)
SGLANG_FP8_PATHS: dict[str, tuple[bool, bool, bool]] = {
    "trtllm_mla": (True, True, True),
    "cutedsl_mla": (True, True, True),
    "flashinfer": (False, False, False),
}
DEFAULT_BACKEND = "trtllm_mla"  # SGLang 0.5.23's choice on SM100 for DeepSeek/Kimi (arg_groups/model_overrides/deepseek_v2.py)
SGLANG_SCALES_SHARD = "model-sglang-kv-scales.safetensors"  # only a control's deliberate scale is written there


def is_sglang_kv_scale(name: str) -> bool:
    """A tensor SGLang would load as an MLA attention's KV scale (transformers has no module for it)."""
    return bool(_SGLANG_VISIBLE.match(name))


def sglang_scale_layer(name: str) -> int:
    return int(_SGLANG_VISIBLE.match(name)[1])


def manifest_kv_scales(kv_fp8: bool, sglang_k_scale: float | None) -> dict[str, Any]:
    """build.json's `kv_scales`: which scale SGLang will use, and the compressed-tensors pair (1.0, compress.split_kv)."""
    if not kv_fp8:
        return {}
    return {"sglang_k_scale": 1.0 if sglang_k_scale is None else float(sglang_k_scale),
            "sglang_visible": SGLANG_SCALES_SHARD if sglang_k_scale is not None else None,
            "compressed_tensors_pair": "model.layers.N.self_attn.k_scale / v_scale = 1.0 (not calibrated)",
            "note": "SGLang 0.5.23's MLA cache is a plain FP8 cast with scale 1; the pair is 1.0 so HF + "
                    "compressed-tensors computes the same"}


def declared_sglang_k_scale(build_dir: Path) -> float:
    """The SGLang-visible k_scale a build may carry: 1.0, or what a control's manifest declares."""
    from qverify.workdir import is_build, read_build_manifest_dict

    if not is_build(build_dir):
        return 1.0
    m = read_build_manifest_dict(build_dir)
    return float((m.get("kv_scales") or {}).get("sglang_k_scale") or 1.0) if m.get("control") else 1.0


def check_sglang_scales(found: dict[str, float], where: str, declared: float = 1.0) -> int:
    """Refuse an SGLang-visible MLA scale other than 1.0 (or, for a control, the value its manifest declares)."""
    from qverify.quantize.manifest import IntegrityError

    for name, value in sorted(found.items()):
        if value not in (1.0, declared):
            raise IntegrityError(
                f"{where}: {name} = {value:g}: SGLang 0.5.23 loads it as the MLA attention's k_scale, and its SM100 "
                f"default (trtllm_mla) multiplies every decode attention logit by it while the cache is written "
                f"unscaled (docs/serve.md, 'FP8 KV on SGLang')",
                fix="rebuild with --force (qverify writes no SGLang-visible MLA scale), or delete that tensor")
    if declared != 1.0 and found and set(found.values()) != {declared}:
        raise IntegrityError(f"{where}: the control declares SGLang k_scale {declared:g} but not every layer carries it",
                             fix="rebuild it with --force")
    return len(found)


def sglang_scales_in_dir(build_dir: Path | str) -> dict[str, float]:
    """{name: value} of every SGLang-visible MLA scale in a checkpoint directory's safetensors."""
    from safetensors import safe_open

    out: dict[str, float] = {}
    for f in sorted(Path(build_dir).glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():  # noqa: SIM118 - a safe_open handle, not a dict
                if is_sglang_kv_scale(k):
                    out[k] = float(st.get_tensor(k).float().reshape(-1)[0])
    return out


def write_control_scale(build_dir: Path, value: float) -> int:
    """The badscale control: `value` under SGLang's k_scale name for every layer with a compressed-tensors pair
    (same dtype and shape as the pair); returns how many. Production builds never call this."""
    import torch
    from safetensors import safe_open

    from qverify.quantize.shards import add_shard, weight_map

    out: dict[str, torch.Tensor] = {}
    for name, shard in weight_map(build_dir).items():
        if (m := _CT_NAME.match(name)) and m[2] == "k":  # (a kimi_k25 wrapper's prefix kept: SGLang strips it)
            with safe_open(build_dir / shard, "pt") as f:
                out[name.replace(".self_attn.k_scale", ".self_attn.k_proj.k_scale")] = torch.full_like(f.get_tensor(name), value)
    add_shard(build_dir, SGLANG_SCALES_SHARD, out)
    return len(out)
