"""The llm-compressor side of a build: validate a stage, check its targets, run oneshot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from qverify.errors import BadInput


def lc_recipe(stage: dict[str, Any], where: str):
    """llm-compressor's own validation of a recipe stage (its modifiers are pydantic models)."""
    from llmcompressor.recipe import Recipe as LCRecipe

    try:
        return LCRecipe.from_dict(stage)
    except (ValueError, TypeError, KeyError, AttributeError) as e:  # pydantic errors are ValueErrors
        msg = str(e).strip().splitlines()
        raise BadInput(f"{where}: llm-compressor rejects the stage: {' '.join(msg[:3])[:300]}",
                       fix="check the modifier arguments against llm-compressor 0.14") from None


def load_source(model_dir: Path, trust_remote_code: bool = False):
    """The (unquantized) source model for calibration; a checkpoint that does not fill its architecture is refused.
    A source that ships quantized modules is loaded layer by layer instead (qverify/quantize/layerwise.py)."""
    from transformers import AutoModelForCausalLM

    from qverify.quantize.shipped import model_code_trust, native_config

    config = native_config(model_dir, trust_remote_code)
    trust_remote_code = model_code_trust(model_dir, trust_remote_code) and config.model_type != "deepseek_v3"
    try:
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype="auto", output_loading_info=True,
                                                           trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as e:
        raise BadInput(f"{model_dir} does not load as a causal LM: {str(e).splitlines()[0][:200]}",
                       fix="pass a Hugging Face model dir (config.json + *.safetensors)") from None
    problems = {k: sorted(v) for k, v in info.items() if v}
    if problems:
        kind, keys = next(iter(problems.items()))
        raise BadInput(f"{model_dir}: checkpoint is incomplete for its architecture ({kind}: {keys[0]})",
                       fix="pass a complete Hugging Face checkpoint")
    return model


def check_targets(model, recipe, where: str) -> None:
    """Each target pattern must match at least one Linear module (after MoE linearization)."""
    import torch
    from compressed_tensors.quantization.lifecycle.initialize import is_cached_attention_module
    from compressed_tensors.utils import is_match

    linears = [(n, m) for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    for mod in recipe.modifiers:
        if not hasattr(mod, "resolve_quantization_config"):
            continue
        qc = mod.resolve_quantization_config()
        ignore = list(qc.ignore or [])
        for group in qc.config_groups.values():
            for target in group.targets:
                if not any(is_match(n, m, target) and not is_match(n, m, ignore) for n, m in linears):
                    raise BadInput(f"{where}: target {target!r} matches no Linear module of {model.config.model_type}",
                                   fix="fix the pattern (module names: see model.named_modules())")
        if qc.kv_cache_scheme is not None and not any(is_cached_attention_module(m) for m in model.modules()):
            raise BadInput(f"{where}: kv_cache_scheme given but the model has no KV-cached attention",
                           fix="drop kv_cache_scheme from the recipe")


def split_kv(stage: dict[str, Any]) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the stage without its kv_cache_scheme, or None when nothing is left to calibrate; the KV scheme or None).

    FP8 KV is never calibrated: SGLang 0.5.23 writes the MLA latent to FP8 with scale 1 and loads no calibrated pair
    (kv_scales.py; docs/serve.md, 'FP8 KV on SGLang'), and the embedded engine computes what SGLang does. Observing
    K and V would cost calibration work for scales no engine uses, so the scheme is applied data-free with scale 1."""
    import copy

    rest, kv = copy.deepcopy(stage), None
    for name, body in list(rest.items()):
        for group, mods in list(body.items()):
            for mod, args in list(mods.items()):
                kv = args.pop("kv_cache_scheme", None) or kv
                if not set(args) - {"ignore"}:  # only the KV scheme was asked of this modifier
                    del mods[mod]
            if not mods:
                del body[group]
        if not body:
            del rest[name]
    return rest or None, kv


def apply_kv_scale_one(model, kv: dict[str, Any]) -> int:
    """The recipe's KV scheme on every cached attention, scales 1.0 (a plain FP8 cast, as SGLang's MLA cache);
    compressed-tensors saves it as the checkpoint's kv_cache_scheme and k_scale/v_scale pair. Returns how many."""
    import torch
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationStatus
    from compressed_tensors.quantization.lifecycle.apply import apply_quantization_config
    from compressed_tensors.quantization.lifecycle.initialize import is_cached_attention_module

    apply_quantization_config(model, QuantizationConfig(config_groups={}, kv_cache_scheme=QuantizationArgs(**kv),
                                                        quantization_status=QuantizationStatus.FROZEN))
    n = 0
    with torch.no_grad():
        for m in model.modules():
            if is_cached_attention_module(m) and hasattr(m, "k_scale"):
                m.k_scale.fill_(1.0)
                m.v_scale.fill_(1.0)
                n += 1
    return n


def quantize(model, stage: dict[str, Any], dataset, seq_len: int, pipeline: str, where: str, processor=None,
             all_experts: bool = True):
    """Run oneshot in place and return the model (experts linearized, quantization applied).

    Only what the recipe changes is calibrated: a KV scheme is applied with scale 1 (`split_kv`), not observed.
    `all_experts=False` routes each calibration token only to the experts its router picks (llm-compressor's
    `moe_calibrate_all_experts`, default True, runs every expert on every token): right when the recipe leaves the
    routed experts alone, since nothing it calibrates reads their inputs, and the forward then matches serving."""
    from llmcompressor.modeling.moe.linearize import linearize_moe

    recipe = lc_recipe(stage, where)
    # oneshot would linearize the fused 3-D experts itself; doing it first lets the target
    # check see the per-expert Linear modules that patterns like `re:.*experts.*` select.
    linearize_moe(model)
    check_targets(model, recipe, where)
    calibrated, kv = split_kv(stage)
    if calibrated is not None:
        _oneshot(model, lc_recipe(calibrated, where), dataset, seq_len, pipeline, processor, all_experts)
    if kv is not None:
        apply_kv_scale_one(model, kv)
        if calibrated is None:  # oneshot did not run: give the model llm-compressor's compressed save all the same
            from llmcompressor.transformers.compression.compressed_tensors_utils import modify_save_pretrained

            modify_save_pretrained(model)
    return model


def _oneshot(model, recipe, dataset, seq_len: int, pipeline: str, processor, all_experts: bool) -> None:
    from llmcompressor import oneshot

    # The sequential pipeline runs one decoder layer at a time, onloading it to the GPU when there is one (llm-compressor
    # picks the device) while the rest stays offloaded on CPU: how a 1T-parameter model calibrates, as in
    # llm-compressor's DeepSeek/Kimi examples. `basic` runs the whole model per batch (faster for tiny models on CPU).
    extra = {"sequential_targets": list(getattr(model, "_no_split_modules", None) or [])} if pipeline == "sequential" else {}
    oneshot(model=model, recipe=recipe, dataset=dataset, num_calibration_samples=len(dataset),
            max_seq_length=seq_len, shuffle_calibration_samples=False, pipeline=pipeline,
            moe_calibrate_all_experts=all_experts,
            # given explicitly: llm-compressor would otherwise load it from the model path without trust_remote_code
            **({"processor": processor} if processor is not None else {}), **extra)


def noise_shared_experts(model, scale: float, seed: int) -> int:
    """The damage dial: w += N(0, (scale * rms(w))^2) on every shared-expert weight matrix; returns how many.

    Relative to each matrix's RMS so one scale means the same damage in every layer; seeded, so
    the same recipe always builds the same weights (a build id is content-addressed).
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    n = 0
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            if "shared_experts" in name and name.endswith("weight") and p.dim() == 2:
                rms = p.float().pow(2).mean().sqrt()
                p.add_((torch.randn(p.shape, generator=gen) * scale * rms).to(p.dtype))
                n += 1
    if n == 0:
        raise BadInput("corrupt.shared_expert_noise: the model has no shared-expert weights",
                       fix="use it on a DeepSeek-V3/Kimi-style MoE with shared experts")
    return n


def save(model, out: Path) -> None:
    """Save compressed; llm-compressor's own recipe.yaml is kept as llmcompressor_recipe.yaml."""
    model.save_pretrained(out, save_compressed=True)
    lc = out / "recipe.yaml"
    if lc.exists():
        lc.rename(out / "llmcompressor_recipe.yaml")
