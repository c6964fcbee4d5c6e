"""Sources that ship already quantized (Kimi: INT4 W4A16 pack-quantized routed experts): keep them as shipped.

A build from such a source never re-quantizes what the release quantized:
- calibration runs with those modules *dequantized*, one decoder layer at a time (layerwise.py; W4A16 serving
  computes exactly dequant(W) @ x in bf16, so the recipe's scales see the activations the served model produces);
- those modules are dropped from the model before saving, and their shipped tensors (`weight_packed`,
  `weight_scale`, `weight_shape`, ...) stay in the source's own shards, copied byte for byte (shipped_build.py);
- the build's quantization_config keeps the source's config groups verbatim and adds the recipe's.
Only compressed-tensors sources are accepted: it is the format the engines (SGLang, vLLM) and this loader read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.quantize.manifest import safetensors_header

# A module is quantized in a compressed-tensors checkpoint when one of these sits beside (or replaces) its weight.
_QUANT_MARKERS = ("weight_packed", "weight_scale")


@dataclass
class Shipped:
    """What the source carried: its quantization_config and, per quantized module, its tensors and shard."""

    config: dict[str, Any]
    modules: dict[str, list[str]] = field(default_factory=dict)  # module -> its tensor names
    shard_of: dict[str, str] = field(default_factory=dict)  # tensor -> shard file name
    nbytes: int = 0

    def tensors(self) -> set[str]:
        return {t for ts in self.modules.values() for t in ts}

    def describe(self) -> dict[str, Any]:
        """The manifest's record of what the source carried (kept as shipped)."""
        groups = {g: {"targets": v.get("targets"), "format": v.get("format") or self.config.get("format"),
                      "weights": {k: (v.get("weights") or {}).get(k) for k in ("num_bits", "type", "strategy", "group_size", "symmetric")}}
                  for g, v in (self.config.get("config_groups") or {}).items()}
        return {"quant_method": self.config.get("quant_method"), "format": self.config.get("format"),
                "config_groups": groups, "modules": len(self.modules), "tensors": len(self.tensors()),
                "bytes": self.nbytes, "kept": "byte for byte"}


def _shards(model_dir: Path) -> list[Path]:
    return sorted(model_dir.glob("*.safetensors"))


def read_shipped(model_dir: Path, config: dict[str, Any]) -> Shipped | None:
    """The source's own quantization (None for an unquantized source); BadInput for a format qverify cannot keep."""
    qc = config.get("quantization_config")
    if not qc:
        return None
    if qc.get("quant_method") != "compressed-tensors":
        raise BadInput(f"{model_dir} is quantized with {qc.get('quant_method')!r}; qverify keeps only compressed-tensors "
                       "quantization as shipped", fix="pass the unquantized model, or a compressed-tensors release")
    if qc.get("kv_cache_scheme") or qc.get("sparsity_config"):
        raise BadInput(f"{model_dir} already carries a KV-cache scheme or sparsity", fix="pass the release without them")
    shipped = Shipped(config=qc)
    headers = {p.name: safetensors_header(p)[0] for p in _shards(model_dir)}
    quantized = {n.rsplit(".", 1)[0] for h in headers.values() for n in h if n.rsplit(".", 1)[-1] in _QUANT_MARKERS}
    for shard, header in headers.items():
        for name, info in header.items():
            module = name.rsplit(".", 1)[0]
            if module in quantized:
                shipped.modules.setdefault(module, []).append(name)
                shipped.shard_of[name] = shard
                shipped.nbytes += info["data_offsets"][1] - info["data_offsets"][0]
    return shipped


def _scheme_for(module: str, qc: dict[str, Any]):
    """The source config group covering `module` (a regex target outranks a class target, as in compressed-tensors)."""
    import re

    from compressed_tensors.quantization import QuantizationScheme

    groups = list((qc.get("config_groups") or {}).values())
    by_regex = [g for g in groups if any(t.startswith("re:") and re.match(t[3:], module) for t in g["targets"])]
    group = (by_regex or [g for g in groups if any(not t.startswith("re:") for t in g["targets"])] or [None])[0]
    if group is None:
        raise BadInput(f"quantized module {module} matches no config group of the source", fix="check its config.json")
    return QuantizationScheme.model_validate({"format": qc.get("format")} | group)


def dequantize(module: str, tensors: dict, qc: dict[str, Any], dtype):
    """One shipped module's weight from its compressed tensors ({'weight_packed': ..., ...}), as the engines compute it."""
    from compressed_tensors.compressors import BaseCompressor

    scheme = _scheme_for(module, qc)
    return BaseCompressor.get_value_from_registry(scheme.format).decompress(tensors, scheme)["weight"].to(dtype)


def model_code_trust(model_dir: Path, trust_remote_code: bool) -> bool:
    """Whether to run the checkpoint's own modeling code: only when transformers has no native class for its
    model_type. Native DeepSeek-V3 is what llm-compressor linearizes and what the loader reloads (Moonlight ships
    model_type deepseek_v3 *and* an auto_map; the remote-code permission is for its tokenizer)."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = json.loads((model_dir / "config.json").read_text()).get("model_type")
    return trust_remote_code and model_type not in CONFIG_MAPPING


def native_config(model_dir: Path, trust_remote_code: bool = False):
    """The model's transformers config; native DeepSeek-V3 for a DeepseekV3ForCausalLM checkpoint under a model_type
    transformers does not know (Kimi K2.x ships `kimi_k2` + a remote configuration_deepseek.py for the same layout),
    so llm-compressor's MoE linearization and the loader see the class they support, and no model code runs."""
    from transformers import AutoConfig, DeepseekV3Config
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    raw = json.loads((model_dir / "config.json").read_text())
    if raw.get("model_type") not in CONFIG_MAPPING and "DeepseekV3ForCausalLM" in (raw.get("architectures") or []):
        return DeepseekV3Config(**{k: v for k, v in raw.items() if k not in ("auto_map", "model_type")})
    return AutoConfig.from_pretrained(model_dir, trust_remote_code=model_code_trust(model_dir, trust_remote_code))


def _native_config_dir(config) -> None:
    """Save the native config (without the source's quantization) where llm-compressor's `validate_model` reads it,
    since it reloads config.json from `name_or_path` without trust_remote_code; removed at exit."""
    import atexit
    import shutil
    import tempfile

    from transformers import PretrainedConfig

    d = tempfile.mkdtemp(prefix="qverify-native-config-")
    atexit.register(shutil.rmtree, d, ignore_errors=True)
    plain = PretrainedConfig.to_dict(config)
    plain.pop("quantization_config", None)
    type(config).from_dict(plain).save_pretrained(d)
    config._name_or_path = d


def drop_shipped_modules(model, shipped: Shipped) -> None:
    """Replace each shipped-quantized module by a parameterless stand-in so saving writes none of its tensors."""
    import torch

    for name in shipped.modules:
        parent_name, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent_name), child, torch.nn.Identity())


def _ignore_without(ignore: list[str], quantized: set[str], modules: set[str]) -> list[str]:
    """The source's `ignore` minus the modules the recipe now quantizes. A regex entry (Kimi ships
    `re:.*shared_experts.*`) that covers any of them is replaced by the names it covers that stay unquantized."""
    import re

    out: list[str] = []
    for entry in ignore:
        if not entry.startswith("re:"):
            out += [] if entry in quantized else [entry]
            continue
        hits = {m for m in modules if re.match(entry[3:], m)}
        out += sorted(hits - quantized) if hits & quantized else [entry]
    return out


def merged_config(shipped: Shipped, recipe_qc: dict[str, Any] | None, weight_map: dict[str, str]) -> dict[str, Any]:
    """Source groups verbatim + the recipe's (renamed `recipe_<g>`); `ignore` no longer hides what the recipe quantized."""
    src = json.loads(json.dumps(shipped.config))
    if not recipe_qc:
        return src
    recipe_modules = {n.rsplit(".", 1)[0] for n in weight_map if n.rsplit(".", 1)[-1] in _QUANT_MARKERS} - set(shipped.modules)
    groups = dict(src.get("config_groups") or {})
    for g, body in (recipe_qc.get("config_groups") or {}).items():
        groups[f"recipe_{g}"] = body | {"format": body.get("format") or recipe_qc.get("format")}
    formats = {b.get("format") for b in groups.values()}
    ignore = _ignore_without(src.get("ignore") or [], recipe_modules, {n.rsplit(".", 1)[0] for n in weight_map})
    ignore += [m for m in recipe_qc.get("ignore") or [] if m not in ignore and m not in shipped.modules]
    return src | {"config_groups": groups, "ignore": ignore, "kv_cache_scheme": recipe_qc.get("kv_cache_scheme"),
                  "format": formats.pop() if len(formats) == 1 else "mixed-precision",
                  "quantization_status": "compressed"}
