"""EAGLE3 drafter heads (what SGLang's Kimi drafters are): kept as an artifact and checked (the embedded engine
loads them to serve: qverify/serve/embedded/eagle3_head.py).

An EAGLE3 head is not a transformers causal LM (no AutoModelForCausalLM class reads it), so a build carries it
byte for byte under drafter/ and checks what SGLang will need instead of reloading it:
- its config: an Eagle3 architecture, hidden size matching the target (its fc reads the target's hidden states);
- its tensor names, against the layouts SGLang 0.5.23's loaders accept: `LlamaForCausalLMEagle3.load_weights`
  (srt/models/llama_eagle3.py: `midlayer.` -> `layers.0.`, `d2t`/`t2d` vocab maps) and
  `Eagle3DeepseekV2ForCausalLM.load_weights` (srt/models/kimi_k25_eagle3.py: `layers.0.` -> `midlayer.`, MLA
  attention for Kimi K2.x). A name neither maps is skipped there with a warning, i.e. a silently random weight;
- its quantization: a head may carry FP8 weights (compressed-tensors FP8_DYNAMIC, `weight_scale` per channel) on
  its decoder layer's Linears only; FP8 on `fc`, `kv_b_proj`, `lm_head` or the embeddings is refused
  (qverify/quantize/eagle3_fp8.py says why each would load wrong in SGLang);
- its bytes: build.json hashes every drafter/ tensor like the target's.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.quantize.eagle3_fp8 import QUANTIZED, head_quantization
from qverify.quantize.manifest import IntegrityError, safetensors_header

# The decoder layer's names in either loader (after its own legacy renames), and the head's top-level names.
_LAYER = re.compile(r"^(?:midlayer|layers\.0)\.(input_layernorm|hidden_norm|post_attention_layernorm|"
                    r"self_attn\.(q_proj|k_proj|v_proj|o_proj|q_a_proj|q_a_layernorm|q_b_proj|kv_a_proj_with_mqa|"
                    r"kv_a_layernorm|kv_b_proj)|mlp\.(gate_proj|up_proj|down_proj))\.weight$")
_TOP = re.compile(r"^(fc\.weight|norm\.weight|lm_head\.weight|embed_tokens\.weight|d2t|t2d|"
                  r"fc_norm\.\d\.weight|aux_norm_(low|mid|high)\.weight|input_norm\.weight)$")
REQUIRED = ("fc.weight", "norm.weight")
REQUIRED_LAYER = ("input_layernorm.weight", "hidden_norm.weight", "post_attention_layernorm.weight", "mlp.down_proj.weight")


def is_eagle3(config: dict[str, Any]) -> bool:
    return any("eagle3" in a.lower() for a in config.get("architectures") or [])


def _names(drafter_dir: Path) -> set[str]:
    return {n.removeprefix("model.") for p in sorted(drafter_dir.glob("*.safetensors")) for n in safetensors_header(p)[0]}


def check_eagle3(drafter_dir: Path, target_config: dict[str, Any]) -> dict[str, Any]:
    """The checks SGLang's EAGLE3 loaders imply; IntegrityError naming the first problem."""
    config = json.loads((drafter_dir / "config.json").read_text())
    where = f"{drafter_dir.parent.name}/{drafter_dir.name}"
    if not is_eagle3(config):
        raise IntegrityError(f"{where}: config architectures {config.get('architectures')} is not an EAGLE3 head",
                             fix="pass the EAGLE3 drafter's own dir")
    target_hidden = target_config.get("text_config", target_config).get("hidden_size")
    hidden = config.get("target_hidden_size") or config.get("hidden_size")
    if target_hidden and hidden != target_hidden:
        raise IntegrityError(f"{where}: EAGLE3 head reads hidden size {hidden}, the target has {target_hidden}",
                             fix="pass the drafter trained for this target")
    names = _names(drafter_dir)
    scales = {n for n in names if n.endswith(".weight_scale")}
    wrong = sorted(n for n in scales if not QUANTIZED.match(n.removesuffix("_scale")))
    if wrong:
        raise IntegrityError(f"{where}: {wrong[0]} is quantized, which SGLang's EAGLE3 loaders cannot load (fc is a plain "
                             "nn.Linear in llama_eagle3.py; the MLA head's kv_b_proj must be a float tensor)",
                             fix="keep fc, kv_b_proj, lm_head and embed_tokens in bf16 (qverify's FP8 drafter stage does)")
    if bool(scales) != bool(config.get("quantization_config")):
        raise IntegrityError(f"{where}: " + ("FP8 weight scales but no quantization_config in config.json" if scales
                                             else "a quantization_config but no weight scales"),
                             fix="export the head with its compressed-tensors quantization_config")
    names -= scales
    unknown = sorted(n for n in names if not (_LAYER.match(n) or _TOP.match(n)))
    if unknown:
        raise IntegrityError(f"{where}: tensor {unknown[0]} is a name SGLang's EAGLE3 loaders skip (would stay random)",
                             fix="export the head with SGLang/SpecForge naming")
    layer = {m.group(1) + ".weight" for n in names if (m := _LAYER.match(n))}
    missing = [n for n in REQUIRED if n not in names] + [f"layers.0.{n}" for n in REQUIRED_LAYER if n not in layer]
    if missing:
        raise IntegrityError(f"{where}: EAGLE3 head lacks {missing[0]}", fix="pass a complete EAGLE3 checkpoint")
    try:
        quantization = head_quantization(config)
    except BadInput as e:  # an unsupported head format is an integrity problem of the build
        raise IntegrityError(f"{where}: {e}", fix="pass a bf16 or compressed-tensors FP8 head") from None
    return {"architecture": config["architectures"][0], "tensors": len(names) + len(scales),
            "draft_vocab_size": config.get("draft_vocab_size") or config.get("vocab_size"),
            "quantization": quantization, "fp8_linears": len(scales)}
