"""A data-free FP8 stage for EAGLE3 heads: what SGLang 0.5.23 loads as an FP8 drafter.

An EAGLE3 head is not a causal LM llm-compressor can load, and FP8_DYNAMIC (per-channel weight scales, per-token
dynamic activations) needs no calibration data, so the stage works on the head's tensors directly, with
compressed-tensors' own scale and rounding functions (the same math llm-compressor's oneshot applies).

What is quantized: the decoder layer's Linear weights (Llama-style q/k/v/o and MLP; the MLA head's q_a, kv_a,
q_b, o and MLP). What stays bf16, and why (SGLang 0.5.23 source):
- `fc`: `LlamaForCausalLMEagle3.fc` is a plain `nn.Linear` (models/llama_eagle3.py) whose loader silently skips
  names it does not know, so an FP8 `fc` would load as a wrong bf16 weight and its scale would be dropped;
- the MLA head's `kv_b_proj`: `Eagle3DeepseekV2ForCausalLM.post_load_weights` (models/kimi_k25_eagle3.py) raises
  on a non-float kv_b_proj (it splits it into w_kc / w_vc itself);
- `lm_head` and `embed_tokens`: shared with or loaded from the target, never quantized by qverify recipes.
The ignore list names them by regex, so it matches SGLang's module prefixes (the MLA head builds its layer
under `model.self_attn`, not `model.midlayer.self_attn`) as well as checkpoint names.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.models import SchemeSummary

QUANTIZED = re.compile(r"^(?:model\.)?(?:midlayer|layers\.0)\.(?:self_attn\.(?:q_proj|k_proj|v_proj|o_proj|q_a_proj|q_b_proj|"
                       r"kv_a_proj_with_mqa)|mlp\.(?:gate_proj|up_proj|down_proj))\.weight$")
KEEP_BF16 = [r"re:(.*\.)?fc$", r"re:.*lm_head$", r"re:.*kv_b_proj$", r"re:.*embed_tokens$"]
SCHEME = "FP8_DYNAMIC"
# What SGLang is told for the head (--speculative-draft-model-quantization): its checkpoint format, or none.
FP8_HEAD_QUANTIZATION = "compressed-tensors"
BF16_HEAD_QUANTIZATION = "unquant"


def stage_scheme(stage: dict[str, Any], recipe: str) -> str:
    """The recipe's drafter stage, read as the one data-free scheme an EAGLE3 head supports; BadInput otherwise."""
    mods = [(name, args) for body in stage.values() for group in body.values() for name, args in group.items()]
    if len(mods) != 1 or mods[0][0] != "QuantizationModifier" or mods[0][1].get("scheme") != SCHEME \
            or mods[0][1].get("config_groups") or mods[0][1].get("kv_cache_scheme"):
        raise BadInput(f"recipe {recipe}: an EAGLE3 head takes only a data-free {SCHEME} QuantizationModifier "
                       f"as its drafter stage (got {[m for m, _ in mods]})",
                       fix="use fp8drafter / fp8kv_nvfp4shared_fp8drafter, or a recipe without a drafter stage")
    return SCHEME


def head_quantization(config: dict[str, Any]) -> str:
    """--speculative-draft-model-quantization for a head with this config.json."""
    qc = config.get("quantization_config") or {}
    if not qc:
        return BF16_HEAD_QUANTIZATION
    if qc.get("quant_method") != "compressed-tensors":
        raise BadInput(f"EAGLE3 head quantized as {qc.get('quant_method')!r}; qverify checks compressed-tensors FP8 heads only",
                       fix="pass a bf16 head, or one exported with compressed-tensors (FP8_DYNAMIC)")
    return FP8_HEAD_QUANTIZATION


def quant_config() -> dict[str, Any]:
    from compressed_tensors.quantization import QuantizationConfig, preset_name_to_scheme

    qc = QuantizationConfig(config_groups={"group_0": preset_name_to_scheme(SCHEME, ["Linear"])}, ignore=KEEP_BF16,
                            format="float-quantized", quantization_status="compressed")
    return qc.model_dump(mode="json")


def _fp8(weight):
    """Per-output-channel FP8 e4m3 weight and its scale, through compressed-tensors' calculate_qparams/quantize."""
    import torch
    from compressed_tensors.quantization import preset_name_to_scheme
    from compressed_tensors.quantization.lifecycle.forward import quantize
    from compressed_tensors.quantization.utils import calculate_qparams

    args = preset_name_to_scheme(SCHEME, ["Linear"]).weights
    w = weight.float()
    zero = torch.zeros(w.shape[0], 1)
    scale, zp = calculate_qparams(torch.minimum(w.amin(dim=1, keepdim=True), zero),
                                  torch.maximum(w.amax(dim=1, keepdim=True), zero), args)
    q = quantize(w, scale, zp, args, dtype=torch.float8_e4m3fn)
    return q, scale.to(weight.dtype)  # llm-compressor saves FP8_DYNAMIC's weight_scale in the model's dtype


def quantize_head(src: Path, dst: Path) -> list[SchemeSummary]:
    """Write `src`'s EAGLE3 head to `dst` with its decoder-layer Linears in FP8; the rest byte-identical in value."""
    from safetensors.torch import load_file, save_file

    config = json.loads((src / "config.json").read_text())
    if config.get("quantization_config"):
        raise BadInput(f"{src} is already quantized ({config['quantization_config'].get('quant_method')})",
                       fix="pick a recipe without a drafter stage; the head is then carried as is")
    dst.mkdir(parents=True, exist_ok=True)
    modules = params = 0
    weight_map: dict[str, str] = {}
    for path in sorted(src.glob("*.safetensors")):
        tensors = load_file(path)
        out = {}
        for name, t in tensors.items():
            if QUANTIZED.match(name):
                out[name], out[name.removesuffix("weight") + "weight_scale"] = _fp8(t)
                modules, params = modules + 1, params + t.numel()
            else:
                out[name] = t
        save_file(out, dst / path.name, metadata={"format": "pt"})
        weight_map |= dict.fromkeys(out, path.name)
    index = src / "model.safetensors.index.json"
    if index.is_file():  # a sharded head: the index must name the new scales too
        data = json.loads(index.read_text())
        (dst / index.name).write_text(json.dumps({**data, "weight_map": weight_map}, indent=2))
    if modules == 0:
        raise BadInput(f"{src}: no decoder-layer Linear weights to quantize", fix="pass a complete EAGLE3 checkpoint")
    config["quantization_config"] = quant_config()
    (dst / "config.json").write_text(json.dumps(config, indent=2))
    return [SchemeSummary(scheme=f"drafter:{SCHEME}", targets=["Linear"], modules=modules, params=params,
                          format="float-quantized")]
