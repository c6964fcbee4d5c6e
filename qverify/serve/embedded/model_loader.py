"""Load a build for serving: the integrity-checked loader (qverify.quantize.loader) plus serving options."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.workdir import is_build, read_build_manifest_dict


@dataclass
class LoadedModel:
    model: Any
    tokenizer: Any
    drafter: Any | None
    served_name: str
    info: dict[str, Any] = field(default_factory=dict)
    fp8_kv: bool = False  # the build's KV cache is FP8 and quantization is on: the engine rounds the latent
    sglang_kv_scales: dict[int, float] = field(default_factory=dict)  # per layer, the k_scale SGLang would load (kv_fp8.py)


def wants_speculative(manifest: dict[str, Any]) -> bool:
    """The drafter is used where the recipe touches it (then the drafter is what is being verified); elsewhere
    it would only change speed, never outputs (the engine accepts exactly the target's own tokens)."""
    serving = manifest.get("serving") or {}
    return bool(serving.get("requires_drafter") or serving.get("draft_model_quantization"))


def load_for_serving(path: Path, quantization: bool = True, speculative: bool | None = None,
                     dtype: str = "float32", trust_remote_code: bool = False) -> LoadedModel:
    """`speculative=None` follows the build's recipe (wants_speculative); True/False force it."""
    import torch

    path = Path(path)
    if not (path / "config.json").exists():
        raise BadInput(f"{path} is not a build or Hugging Face model directory (no config.json)",
                       fix="pass a build dir from `qverify builds` or a local HF model dir")
    manifest: dict[str, Any] = {}
    if is_build(path):
        from qverify.quantize.loader import load_build

        lb = load_build(path, trust_remote_code=trust_remote_code)
        if not quantization:
            lb.set_quantization_enabled(False)
        model, tok, drafter = lb.model, lb.tokenizer, lb.drafter
        manifest = read_build_manifest_dict(path)
    else:  # a plain HF model directory (no build): load it as is
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path)
        tok = AutoTokenizer.from_pretrained(path)
        has = (path / "drafter" / "config.json").exists()
        drafter = AutoModelForCausalLM.from_pretrained(path / "drafter") if has else None
    use_spec = wants_speculative(manifest) if speculative is None else speculative
    model = model.to(getattr(torch, dtype)).eval()
    drafter = drafter.to(getattr(torch, dtype)).eval() if (drafter is not None and use_spec) else None
    if use_spec and manifest.get("drafter_kind") == "eagle3":  # checked for SGLang by load_build; run here too
        from qverify.quantize.loader import set_quantization_enabled
        from qverify.serve.embedded.eagle3_head import load_eagle3_head

        drafter = load_eagle3_head(path / "drafter", model, getattr(torch, dtype))
        if not quantization:
            set_quantization_enabled(drafter, False)
    if is_build(path):  # compressed-tensors' forward without its per-call offload and weight re-quantization
        from qverify.serve.embedded.ct_forward import prepare_for_serving

        for m in (model, drafter):
            if m is not None:
                prepare_for_serving(m)
    info = {"build_id": manifest.get("build_id"), "recipe": manifest.get("recipe"), "model_path": str(path),
            "kv_cache_dtype": manifest.get("kv_dtype", "bf16"), "kv_bytes_per_token": manifest.get("kv_bytes_per_token"),
            "quantization_enabled": quantization, "dtype": dtype}
    fp8_kv = quantization and str(info["kv_cache_dtype"]).startswith("fp8")
    scales = {}
    if fp8_kv:
        from qverify.serve.embedded.kv_fp8 import sglang_k_scales

        scales = sglang_k_scales(path)
    return LoadedModel(model=model, tokenizer=tok, drafter=drafter, served_name=manifest.get("build_id") or path.name,
                       info=info, fp8_kv=fp8_kv, sglang_kv_scales=scales)
