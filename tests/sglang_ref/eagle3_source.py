"""SGLang 0.5.23's EAGLE3 weight loading, cut from its installed source with `ast` and run on CPU tensors.

`sglang.srt.models.llama_eagle3`, `...kimi_k25_eagle3` and `...layers.quantization.compressed_tensors.utils` import
GPU-only packages (tvm_ffi) at module level. The functions used here are plain name handling: they run as SGLang
wrote them, with a stand-in module whose parameters are SGLang's own names for the head (see PARAMS below) and
whose weight loaders record what they were given.
"""

from __future__ import annotations

import ast
import logging
import re
from collections.abc import Iterable, Mapping
from types import MappingProxyType, SimpleNamespace
from typing import Optional

import torch

from tests.sglang_ref.sglang_source import function_source, sglang_file

LLAMA = "sglang.srt.models.llama_eagle3"
MLA = "sglang.srt.models.kimi_k25_eagle3"
CT_UTILS = "sglang.srt.layers.quantization.compressed_tensors.utils"

# named_parameters() of SGLang's modules (unquantized names; a compressed-tensors FP8 Linear adds `weight_scale`),
# read from LlamaForCausalLMEagle3 / LlamaModel (llama_eagle3.py) and Eagle3DeepseekV2ForCausalLM /
# Eagle3MLAModel / Eagle3MLADecoderLayer (kimi_k25_eagle3.py).
LLAMA_LINEARS = ["model.fc", "model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                 "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj", "lm_head"]
LLAMA_OTHER = ["model.embed_tokens", "model.norm", "model.layers.0.input_layernorm", "model.layers.0.hidden_norm",
               "model.layers.0.post_attention_layernorm"]
MLA_LINEARS = ["model.fc", "model.midlayer.self_attn.fused_qkv_a_proj_with_mqa", "model.midlayer.self_attn.q_b_proj",
               "model.midlayer.self_attn.kv_b_proj", "model.midlayer.self_attn.o_proj", "model.midlayer.mlp.gate_up_proj",
               "model.midlayer.mlp.down_proj", "lm_head"]
MLA_OTHER = ["model.embed_tokens", "model.norm", "model.midlayer.input_layernorm", "model.midlayer.hidden_norm",
             "model.midlayer.post_attention_layernorm", "model.midlayer.self_attn.q_a_layernorm",
             "model.midlayer.self_attn.kv_a_layernorm"]
# SGLang's module prefixes, which its compressed-tensors ignore list is matched against. The MLA head builds its
# decoder layer with the model's prefix (Eagle3MLAModel passes prefix=prefix), hence "model.self_attn....".
PREFIX = {"model.midlayer.": "model.", "model.layers.0.": "model."}
FUSED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"],
         "fused_qkv_a_proj_with_mqa": ["q_a_proj", "kv_a_proj_with_mqa"]}


def _cut(module: str, qualname: str, scope: dict):
    fn = function_source(module, qualname)
    fn.decorator_list = []
    exec(compile(ast.Module(body=[fn], type_ignores=[]), str(sglang_file(module)), "exec"), scope)  # noqa: S102 -- SGLang's own code, cut from its installed source
    return scope[fn.name]


def _cut_module_fns(module: str, names: list[str], scope: dict) -> dict:
    tree = ast.parse(sglang_file(module).read_text())
    body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    missing = set(names) - {n.name for n in body}
    if missing:
        raise LookupError(f"{sorted(missing)} not found in {module}")
    exec(compile(ast.Module(body=body, type_ignores=[]), str(sglang_file(module)), "exec"), scope)  # noqa: S102 -- SGLang's own code
    return scope


def should_ignore_layer(layer_name: str, ignore: list[str]) -> bool:
    """compressed_tensors/utils.py `should_ignore_layer`, with SGLang's fused-module mapping for these heads."""
    scope = {"re": re, "Iterable": Iterable, "Mapping": Mapping, "List": list,  # SGLang annotates with typing.List
             "Optional": Optional,
             "MappingProxyType": MappingProxyType}
    fns = _cut_module_fns(CT_UTILS, ["should_ignore_layer", "check_equal_or_regex_match", "_is_equal_or_regex_match"], scope)
    return fns["should_ignore_layer"](layer_name, ignore=ignore, fused_mapping=FUSED)


class _Param:
    """A parameter whose SGLang weight loader records (its name, the shard id, the tensor it was given)."""

    def __init__(self, name: str, log: list):
        self.name = name
        self.weight_loader = lambda param, loaded, shard_id=None: log.append((name, shard_id, loaded))


def load(kind: str, tensors: dict[str, torch.Tensor], quantized_linears: list[str]) -> tuple[dict[str, list], list[str]]:
    """Run SGLang's `load_weights` for `kind` ('llama' or 'mla') over `tensors`.

    Returns (SGLang parameter -> [(shard id, tensor)] it received, the checkpoint names it dropped without a word).
    `quantized_linears` (module names) get the `weight_scale` parameter a compressed-tensors FP8 Linear registers.
    """
    linears, other = (LLAMA_LINEARS, LLAMA_OTHER) if kind == "llama" else (MLA_LINEARS, MLA_OTHER)
    log: list = []
    names = [f"{m}.weight" for m in linears + other] + [f"{m}.weight_scale" for m in quantized_linears]
    params = {n: _Param(n, log) for n in names}
    this = SimpleNamespace(named_parameters=lambda: list(params.items()), hot_token_id=None, post_load_weights=lambda: None)
    scope = {"torch": torch, "re": re, "default_weight_loader": None, "logger": logging.getLogger("sglang-ref"),
             "Iterable": Iterable, "Tuple": tuple}
    qualname = "LlamaForCausalLMEagle3.load_weights" if kind == "llama" else "Eagle3DeepseekV2ForCausalLM.load_weights"
    _cut(LLAMA if kind == "llama" else MLA, qualname, scope)(this, iter(tensors.items()))
    got: dict[str, list] = {}
    for name, shard, t in log:
        got.setdefault(name, []).append((shard, t))
    seen = {id(t) for _, _, t in log}
    fused = {n.rsplit(".", 1)[1] for n in got if "fused_qkv_a_proj_with_mqa" in n}  # weight / weight_scale
    dropped = [n for n, t in tensors.items() if id(t) not in seen and n not in ("d2t", "t2d")
               and not (("q_a_proj." in n or "kv_a_proj_with_mqa." in n) and n.rsplit(".", 1)[1] in fused)]
    return got, dropped


def mla_post_load(kv_b_proj: torch.Tensor, nope: int, v: int) -> None:
    """`Eagle3DeepseekV2ForCausalLM.post_load_weights`: raises on a non-float kv_b_proj."""
    fn = _cut(MLA, "Eagle3DeepseekV2ForCausalLM.post_load_weights", {"torch": torch})
    attn = SimpleNamespace(kv_b_proj=SimpleNamespace(weight=kv_b_proj), qk_nope_head_dim=nope, v_head_dim=v)
    fn(SimpleNamespace(model=SimpleNamespace(midlayer=SimpleNamespace(self_attn=attn))))


def sglang_prefix(param_module: str) -> str:
    for a, b in PREFIX.items():
        if param_module.startswith(a):
            return b + param_module[len(a):]
    return param_module
