"""Load one Hugging Face checkpoint dir so that every tensor provably is the checkpoint's.

Measured with transformers 5.17 + compressed-tensors 0.19: `from_pretrained` on an MoE
compressed-tensors build rewrites the routed-expert converters to expect packed weights.
When the experts were *not* quantized (fp8kv, nvfp4shared) that either raises IndexError
in `get_experts_scheme` (KV-only) or silently random-initialises the routed experts
(NVFP4 shared); when they *were* quantized (nvfp4_all) it drops their global scales and
dequantizes them wrongly. So:

- no quantized expert tensors in the checkpoint: transformers' normal loading, with its
  expert converters left alone (experts stay fused 3-D, numerics identical to bf16);
- quantized expert tensors: build the model, linearize the experts the way llm-compressor
  did before saving (per-expert Linear), apply the saved quantization config and load the
  state dict 1:1.

Either way the result is then checked: no missing, unexpected or mismatched key, and every
reloaded tensor is bitwise equal to the checkpoint's (before decompression).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from qverify.quantize.kv_scales import check_sglang_scales, declared_sglang_k_scale, is_sglang_kv_scale
from qverify.quantize.manifest import IntegrityError, safetensors_header

_EXPERT_KEY = re.compile(r"^(?P<prefix>.*\.experts)\.(?P<idx>\d+)\.(?P<rest>.+)$")
_QUANTIZED_EXPERT = re.compile(r"\.experts\.\d+\..*\.(weight_packed|weight_scale|weight_global_scale|input_global_scale|weight_zero_point)$")


@dataclass
class LoadCheck:
    path: str
    mode: str  # "transformers" or "linearized"
    tensors: int  # checkpoint tensors compared bitwise
    quantized: bool
    sglang_kv_scales: int = 0  # SGLang-visible MLA KV scales (kv_scales.py: 1.0, or a control's declared value)


def _shard_files(path: Path) -> list[Path]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise IntegrityError(f"{path} has no *.safetensors", fix="rebuild it with --force")
    return files


def _iter_shards(path: Path):
    """Each shard's tensors, one shard in memory at a time; SGLang's KV scale names are set aside
    (no transformers module holds them; kv_scales.check_sglang_scales checks their values)."""
    from safetensors.torch import load_file

    for f in _shard_files(path):
        shard = load_file(f)
        yield {k: v for k, v in shard.items() if not is_sglang_kv_scale(k)}, {k: v for k, v in shard.items() if is_sglang_kv_scale(k)}


def _checkpoint_keys(path: Path) -> list[str]:
    return [k for f in _shard_files(path) for k in safetensors_header(f)[0] if not is_sglang_kv_scale(k)]


@contextlib.contextmanager
def _plain_expert_loading():
    """Keep transformers' own expert converters (the checkpoint has no quantized experts)."""
    from compressed_tensors.utils import patch_attr
    from transformers.quantizers.quantizer_compressed_tensors import CompressedTensorsHfQuantizer

    def update_weight_conversions(self, weight_conversions):
        return list(weight_conversions) + self.get_weight_conversions()

    with patch_attr(CompressedTensorsHfQuantizer, "update_weight_conversions", update_weight_conversions):
        yield


def _missing_expert(keys) -> str | None:
    """The first per-expert tensor absent while its siblings exist (why fusing the experts fails)."""
    groups: dict[tuple[str, str], set[int]] = {}
    for k in keys:
        if m := _EXPERT_KEY.search(k):
            groups.setdefault((m["prefix"], m["rest"]), set()).add(int(m["idx"]))
    n = max((max(v) + 1 for v in groups.values()), default=0)
    for (prefix, rest), idx in sorted(groups.items()):
        missing = sorted(set(range(n)) - idx)
        if missing:
            return f"{prefix}.{missing[0]}.{rest}"
    return None


def _load_transformers(path: Path, keys):
    from transformers import AutoModelForCausalLM

    try:
        with _plain_expert_loading():
            model, info = AutoModelForCausalLM.from_pretrained(path, dtype="auto", output_loading_info=True)
    except (RuntimeError, ValueError, KeyError, IndexError, OSError) as e:
        # e.g. a per-expert tensor missing from the checkpoint: the experts cannot be fused
        missing = _missing_expert(keys)
        cause = f"tensor {missing} is missing" if missing else " ".join(str(e).split())[:200]
        raise IntegrityError(f"{path.name}: the checkpoint does not load: {cause}",
                             fix="do not serve this build; rebuild it") from None
    info["unexpected_keys"] = {k for k in info.get("unexpected_keys") or () if not is_sglang_kv_scale(k)}
    problems = {k: sorted(v) for k, v in info.items() if v}
    if problems:
        kind, keys = next(iter(problems.items()))
        raise IntegrityError(f"{path.name}: loading reported {kind}: {', '.join(map(str, keys[:3]))}"
                             f"{' ...' if len(keys) > 3 else ''}", fix="the build does not match its architecture; rebuild it")
    return model


@contextlib.contextmanager
def _quiet_libraries():
    """Mute warnings that are expected here: llm-compressor's 'linearizing after load' advice, and
    compressed-tensors' 'could not match' for a regex target that a class target also covers."""
    from loguru import logger

    match_log = logging.getLogger("compressed_tensors.utils.match")
    level = match_log.level
    logger.disable("llmcompressor")
    match_log.setLevel(logging.ERROR)
    try:
        yield
    finally:
        if os.environ.get("LLM_COMPRESSOR_LOG_DISABLED", "").lower() != "true":  # leave a user's "off" alone
            logger.enable("llmcompressor")
        match_log.setLevel(level)


def _load_linearized(path: Path):
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, apply_quantization_config
    from llmcompressor.modeling.moe.linearize import linearize_moe
    from llmcompressor.utils.dev import skip_weights_initialize
    from transformers import AutoModelForCausalLM

    from qverify.quantize.shipped import native_config

    config = native_config(path)  # Kimi's model_type kimi_k2 -> native DeepSeek-V3, no remote model code
    qconfig = QuantizationConfig.model_validate(config.quantization_config)
    del config.quantization_config
    dtype = getattr(config, "dtype", None) or torch.bfloat16
    with skip_weights_initialize():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    with _quiet_libraries():
        linearize_moe(model)
        apply_quantization_config(model, qconfig, run_compressed=False, show_progress=False)
    ModelCompressor(quantization_config=qconfig).compress_model(model)
    # assign=True keeps each tensor's checkpoint dtype (e.g. the fp32 router bias); one shard at a time.
    expected, loaded, unexpected = set(model.state_dict()), set(), []
    for shard, _ in _iter_shards(path):
        result = model.load_state_dict(shard, strict=False, assign=True)
        unexpected += result.unexpected_keys
        loaded |= set(shard)
        del shard
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if getattr(config, "tie_word_embeddings", False) else set()
    missing = sorted(expected - loaded - tied)
    for kind, keys in (("missing", missing), ("unexpected", unexpected)):
        if keys:
            raise IntegrityError(f"{path.name}: {len(keys)} {kind} tensors on load, e.g. {keys[0]}",
                                 fix="the build does not match its architecture; rebuild it")
    model.tie_weights()
    for name, t in model.state_dict().items():  # as from_pretrained does (e.g. the router bias)
        if any(k in name for k in getattr(model, "_keep_in_fp32_modules_strict", None) or ()) and t.is_floating_point():
            t.data = t.data.float()
    return model, qconfig


def _same(a, b) -> bool:
    import torch

    if a.shape != b.shape:
        return False
    if a.dtype != b.dtype:
        # transformers upcasts some tensors on load (e.g. DeepSeek's router bias to fp32): fine
        # only when lossless, i.e. the round trip gives back the checkpoint's bits.
        return a.dtype.is_floating_point and b.dtype.is_floating_point and _same(a.to(b.dtype), b) \
            and _same(b.to(a.dtype), a)
    # Byte view: exact, NaN-safe, and defined for fp8 dtypes where torch.equal is not.
    return torch.equal(a.contiguous().view(-1).view(torch.uint8), b.contiguous().view(-1).view(torch.uint8))


def compare_to_checkpoint(model, ckpt: dict, mode: str, path: Path, state: dict | None = None,
                          all_keys: set[str] | None = None) -> int:
    """Every checkpoint tensor must be in the model, bitwise equal; nothing else may be.

    Called once per shard with `state` (the model's, computed once) and `all_keys` (every checkpoint name).
    """
    if state is None:
        state = model.state_dict()
        if mode == "transformers":
            from transformers.core_model_loading import revert_weight_conversion

            state = revert_weight_conversion(model, dict(state))
    keys = set(ckpt) if all_keys is None else all_keys
    missing = [k for k in ckpt if k not in state]
    if missing:
        raise IntegrityError(f"{path.name}: tensor {missing[0]} was not loaded ({len(missing)} in all)",
                             fix="do not serve this build; rebuild it")
    ptrs = {t.data_ptr() for k, t in state.items() if k in keys}
    extra = [k for k, t in state.items() if k not in keys and t.data_ptr() not in ptrs]  # tied aliases are fine
    if extra:
        raise IntegrityError(f"{path.name}: model tensor {extra[0]} is not in the checkpoint (freshly initialised)",
                             fix="do not serve this build; rebuild it")
    for k, t in ckpt.items():
        if not _same(state[k], t):
            raise IntegrityError(f"{path.name}: reloaded tensor {k} differs from the checkpoint",
                                 fix="do not serve this build; the loader is broken for this architecture")
    return len(ckpt)


def _compare_streamed(model, mode: str, path: Path) -> tuple[int, int]:
    """Compare shard by shard (peak memory: the model plus one shard); returns (tensors, SGLang KV scales)."""
    state = model.state_dict()
    if mode == "transformers":
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(model, dict(state))
    all_keys, n, sglang = set(_checkpoint_keys(path)), 0, {}
    for shard, scales in _iter_shards(path):
        n += compare_to_checkpoint(model, shard, mode, path, state=state, all_keys=all_keys)
        sglang |= {k: v.float().item() for k, v in scales.items()}
    return n, check_sglang_scales(sglang, path.name, declared_sglang_k_scale(path))


def load_checkpoint(path: Path):
    """(model on CPU in eval mode with weights decompressed, LoadCheck); IntegrityError on any mismatch."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig

    config = json.loads((path / "config.json").read_text())
    keys = _checkpoint_keys(path)
    qc = config.get("quantization_config")
    if qc and any(_QUANTIZED_EXPERT.search(k) for k in keys):
        model, qconfig = _load_linearized(path)
        mode = "linearized"
    else:
        model = _load_transformers(path, keys)
        qconfig = QuantizationConfig.model_validate(qc) if qc else None
        mode = "transformers"
    n, sglang_scales = _compare_streamed(model, mode, path)
    if hasattr(model, "ct_decompress_hook"):
        # Decompress now rather than in a hook on the first forward (which may run on a server thread).
        ModelCompressor(quantization_config=qconfig).decompress_model(model)
    model.eval()
    return model, LoadCheck(path=str(path), mode=mode, tensors=n, quantized=qc is not None, sglang_kv_scales=sglang_scales)
