"""Checks on the tensors a recipe wrote into a build, without rebuilding the model (`shipped_build.verify_streamed`).

Each tensor must belong to a module of the text model; each quantized weight must decompress (compressed-tensors'
own decompressor, with the build's quantization_config) to the shape of the weight it replaces, with finite values;
KV scales must be finite and positive, and SGLang's one scale per layer must equal the max of its pair.
"""

from __future__ import annotations

import re

from qverify.quantize.layout import Layout
from qverify.quantize.manifest import IntegrityError

_KV = re.compile(r"\.self_attn\.(k_proj\.k_scale|[kv]_scale)$")
_QUANT_LEAVES = ("weight_packed", "weight_scale", "weight_global_scale", "weight_zero_point", "weight_shape")


def _expected_shapes(layout: Layout) -> tuple[dict[str, tuple], set[str]]:
    """{weight name: shape} and the module names of the text model, from a meta-device build (no memory)."""
    import torch

    from qverify.quantize.layerwise import _meta_model, _text_config

    model = _meta_model(_text_config(layout), torch.bfloat16)
    return {n: tuple(t.shape) for n, t in model.state_dict().items()}, {n for n, _ in model.named_modules()}


def _check_kv_scale(name: str, t, modules: set[str], where: str) -> None:
    """A KV scale sits on an attention of the text model and is a positive finite number."""
    import torch

    if name.split(".self_attn.")[0] + ".self_attn" not in modules:
        raise IntegrityError(f"{where}: {name} belongs to no attention of the text model", fix="rebuild it with --force")
    if not (torch.isfinite(t.float()).all() and (t.float() > 0).all()):
        raise IntegrityError(f"{where}: KV scale {name} is not a positive finite number", fix="rebuild it with --force")


def check_recipe_tensors(tensors: dict, layout: Layout, qc: dict, where: str, declared_k_scale: float = 1.0) -> int:
    """Check `tensors` ({text-model name: tensor}); returns how many were checked. `declared_k_scale`: the one
    SGLang-visible MLA scale a control may carry (kv_scales.check_sglang_scales; 1.0 for every other build)."""
    import torch

    from qverify.quantize.kv_scales import check_sglang_scales, is_sglang_kv_scale
    from qverify.quantize.shipped import dequantize

    if not tensors:
        return 0
    shapes, modules = _expected_shapes(layout)
    by_module: dict[str, dict] = {}
    for name, t in tensors.items():
        module, leaf = name.rsplit(".", 1)
        if _KV.search(name):
            _check_kv_scale(name, t, modules, where)
        elif module not in modules:
            raise IntegrityError(f"{where}: {name} belongs to no module of the text model", fix="rebuild it with --force")
        elif leaf in _QUANT_LEAVES:
            by_module.setdefault(module, {})[leaf] = t
        elif name in shapes and tuple(t.shape) != shapes[name]:
            raise IntegrityError(f"{where}: {name} has shape {tuple(t.shape)}, the text model {shapes[name]}",
                                 fix="rebuild it with --force")
    for module, parts in by_module.items():
        weight = dequantize(module, parts, qc, torch.float32)
        want = shapes.get(f"{module}.weight")
        if tuple(weight.shape) != want or not torch.isfinite(weight).all():
            raise IntegrityError(f"{where}: {module} decompresses to {tuple(weight.shape)} (expected {want}) or to "
                                 "non-finite values", fix="rebuild it with --force")
    sglang = {k: v.float().item() for k, v in tensors.items() if is_sglang_kv_scale(k)}
    check_sglang_scales(sglang, where, declared_k_scale)
    return len(tensors)
