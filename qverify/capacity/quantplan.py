"""What a recipe does to memory: KV dtype and the weight scheme per module class.

`quant_plan(name)` reads a shipped recipe (or a recipe YAML path) through qverify.quantize's
validated recipe model and derives the summary from its llm-compressor stages; the only
table here is the planner-only variants for published full-size checkpoints
(nvfp4_experts, int4_experts), which have no recipe to build with.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator

from qverify.capacity.kv import KVDtype
from qverify.capacity.schemes import SchemeName
from qverify.capacity.weights import LINEAR_CLASSES
from qverify.errors import BadInput
from qverify.registry import unknown_message
from qverify.strict import Strict


class QuantPlan(Strict):

    name: str
    kv_dtype: KVDtype = "bf16"
    schemes: dict[str, SchemeName] = Field(default_factory=dict, description="module class -> weight scheme; absent = bf16")
    drafter_scheme: SchemeName = "bf16"
    source: str = "planner-only table"
    description: str = ""

    @field_validator("schemes")
    @classmethod
    def _known_classes(cls, v: dict[str, str]) -> dict[str, str]:
        bad = sorted(set(v) - set(LINEAR_CLASSES))
        if bad:
            raise ValueError(f"unknown module classes {bad}; use {list(LINEAR_CLASSES)}")
        return {k: s for k, s in v.items() if s != "bf16"}


# Planner-only: the layouts behind published full-size Kimi K2.6 figures (no recipe builds them here).
PLANNER_ONLY: dict[str, QuantPlan] = {p.name: p for p in [
    QuantPlan(name="nvfp4_experts", schemes={"routed_experts": "nvfp4"},
              description="NVFP4 routed experts, the rest bf16 (the published 595 GB Kimi K2.6 figure)"),
    QuantPlan(name="fp8kv_nvfp4_experts", kv_dtype="fp8", schemes={"routed_experts": "nvfp4"}),
    QuantPlan(name="int4_experts", schemes={"routed_experts": "int4_g32"},
              description="W4A16 group-32 routed experts: Kimi K2.6 as Moonshot ships it"),
]}

# One module name per Linear kind of each class, DeepSeek-V3 and Llama naming, to test targets on.
_PROBES: dict[str, list[str]] = {
    "attention": [f"model.layers.3.self_attn.{n}" for n in
                  ("q_proj", "k_proj", "v_proj", "q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "kv_b_proj", "o_proj")],
    "dense_mlp": [f"model.layers.0.mlp.{n}" for n in ("gate_proj", "up_proj", "down_proj")],
    "routed_experts": [f"model.layers.3.mlp.experts.7.{n}" for n in ("gate_proj", "up_proj", "down_proj")],
    "shared_experts": [f"model.layers.3.mlp.shared_experts.{n}" for n in ("gate_proj", "up_proj", "down_proj")],
    "lm_head": ["lm_head"],
}
_PRESETS = {"NVFP4": "nvfp4", "NVFP4A16": "nvfp4", "FP8_DYNAMIC": "fp8", "FP8": "fp8_tensor", "FP8_BLOCK": "fp8_block",
            "W4A16": "int4_g128", "W4A16_ASYM": "int4_g128", "W8A8": "fp8", "BF16": "bf16"}


def _matches(name: str, target: str) -> bool:
    if target == "Linear":  # every probe is an nn.Linear
        return True
    if target.startswith("re:"):
        return re.match(target[3:], name) is not None
    return name == target or name.endswith("." + target)


def _weights_scheme(node: dict[str, Any], where: str) -> str:
    if isinstance(node.get("scheme"), str):
        key = node["scheme"].upper()
        if key in _PRESETS:
            return _PRESETS[key]
    w = node.get("weights") or {}
    bits, typ, strat = w.get("num_bits"), w.get("type"), str(w.get("strategy", "")).lower()
    group = w.get("group_size")
    found = {(4, "float"): "nvfp4", (8, "float"): {"channel": "fp8", "tensor": "fp8_tensor", "block": "fp8_block"}.get(strat),
             (4, "int"): {32: "int4_g32", 128: "int4_g128"}.get(group)}.get((bits, typ))
    if not found:
        raise BadInput(f"{where}: the planner cannot price weight scheme {node.get('scheme') or w}",
                       fix="use an NVFP4 / FP8 / FP8_DYNAMIC / FP8_BLOCK / W4A16 scheme, or pass --weights-gb")
    return found


def _groups(tree: Any, path: str = "") -> list[tuple[str, list[str], list[str], dict[str, Any]]]:
    """Every (path, targets, ignore, scheme-node) in an llm-compressor recipe, at any depth."""
    out: list[tuple[str, list[str], list[str], dict[str, Any]]] = []
    if isinstance(tree, dict):
        ignore = list(tree.get("ignore") or [])
        if "scheme" in tree and tree["scheme"] is not None:
            scheme = tree["scheme"]
            if isinstance(scheme, dict):  # {SCHEME: [targets]} form
                out += [(path, list(t), ignore, {"scheme": k}) for k, t in scheme.items()]
            else:
                out.append((path, list(tree.get("targets") or ["Linear"]), ignore, tree))
        for gname, g in (tree.get("config_groups") or {}).items():
            out.append((f"{path}.{gname}", list(g.get("targets") or []), ignore, g))
        for k, v in tree.items():
            if k not in ("config_groups", "scheme"):
                out += _groups(v, f"{path}.{k}" if path else str(k))
    elif isinstance(tree, list):
        for i, v in enumerate(tree):
            out += _groups(v, f"{path}[{i}]")
    return out


def _has_kv_scheme(tree: Any) -> bool:
    if isinstance(tree, dict):
        if tree.get("kv_cache_scheme"):
            return True
        return any(_has_kv_scheme(v) for v in tree.values())
    return isinstance(tree, list) and any(_has_kv_scheme(v) for v in tree)


def from_tree(tree: dict[str, Any], name: str, source: str) -> QuantPlan:
    """Derive a QuantPlan from a recipe mapping: llm-compressor stages plus qverify's `serving` block."""
    serving = tree.get("serving") or {}
    kv = "fp8" if _has_kv_scheme(tree) or "fp8" in str(serving.get("kv_cache_dtype", "")).lower() else "bf16"
    schemes: dict[str, str] = {}
    drafter = "bf16"
    for where, targets, ignore, node in _groups(tree):
        scheme = _weights_scheme(node, f"{source} {where}")
        if "draft" in where.lower():
            drafter = scheme if drafter == "bf16" else drafter
            continue
        for cls, probes in _PROBES.items():
            hit = [p for p in probes if any(_matches(p, t) for t in targets) and not any(_matches(p, i) for i in ignore)]
            if hit and cls not in schemes:
                schemes[cls] = scheme
    return QuantPlan(name=name, kv_dtype=kv, schemes=schemes, drafter_scheme=drafter, source=source,
                     description=str(tree.get("description") or ""))


def quant_plan(name_or_path: str) -> QuantPlan:
    """The QuantPlan for a recipe name or a recipe YAML path; planner-only names come from PLANNER_ONLY."""
    from qverify.quantize.recipe import list_recipes, load_recipe

    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml"):
        if not p.is_file():
            raise BadInput(f"recipe file {p} does not exist", fix="pass a recipe name or an existing YAML path")
    elif name_or_path in PLANNER_ONLY:
        return PLANNER_ONLY[name_or_path]
    else:
        known = sorted({r.recipe.name for r in list_recipes()} | set(PLANNER_ONLY))
        if name_or_path not in known:
            raise BadInput(unknown_message("recipe", name_or_path, known), fix=f"use one of: {', '.join(known)}")
    loaded = load_recipe(name_or_path)  # extra="forbid", file:line:col errors
    source = f"qverify/quantize/recipes/{loaded.path.name}" if loaded.builtin else str(loaded.path)
    return from_tree(loaded.recipe.model_dump(mode="json"), loaded.recipe.name, source)


def shipped_schemes(config: dict[str, Any]) -> dict[str, str]:
    """Module class -> scheme for what a checkpoint already ships quantized (its compressed-tensors
    quantization_config), e.g. Kimi's INT4 group-32 routed experts; a build keeps these as shipped."""
    qc = config.get("quantization_config") or (config.get("text_config") or {}).get("quantization_config")
    if not qc:
        return {}
    return from_tree({"source": qc}, "source", "config.json quantization_config").schemes


def with_source(qp: QuantPlan, config: dict[str, Any]) -> QuantPlan:
    """The recipe applied on top of the source: modules the recipe leaves alone keep the source's scheme."""
    base = shipped_schemes(config)
    return qp.model_copy(update={"schemes": base | dict(qp.schemes)}) if base else qp
