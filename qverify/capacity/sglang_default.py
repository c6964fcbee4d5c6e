"""SGLang 0.5.23's own default `--mem-fraction-static`, for the model and the launch flags (no profile, no --mem-fraction).

Read in srt/arg_groups/memory_hook.py `handle_gpu_memory_settings` (lines cited below, SGLang 0.5.23 as installed):
- capacity defaults by the GPU's total memory (MiB): `chunked_prefill_size` and the decode CUDA graph's `max_bs`
  (memory_hook.py:89-170; capped by --max-running-requests, :182-188);
- reserved MiB = 512 + max(chunked, 2048) x 1.5 + tp x pp / 8 x 1024 + the graph reserve (:308-313), at least
  10 GiB on a GPU over 60 GiB (:314-315); the graph reserve is decode max_bs x 2, plus 1.5 GiB for an MLA
  model's prefill graph when that stays on (`reserve_for_graph_mb`, :364-389);
- fraction = round((total - reserved) / total, 3) (:324-328);
- a multimodal checkpoint (a `vision_config`; kimi_k25 counts, srt/configs/model_config.py) is scaled by
  `adjust_mem_fraction_for_vlm` (:417-462): 0.95 x clamp(1 - 0.1 x (ViT layers x hidden^2 / (24 x 1024^2) - 1),
  0.8, 1.05), about 0.91 for Kimi's MoonViT (27 layers, hidden 1152).
The prefill graph (breakable, CUDA's default, srt/model_executor/cuda_graph_config.py:119-122) is switched off for
`DeepseekV3ForCausalLM` on trtllm_mla, SGLang's SM100 default for it (srt/arg_groups/cuda_graph_hook.py:281-315,
model_overrides/deepseek_v2.py:179-187), and for multimodal architectures outside SGLang's allowlist
(cuda_graph_hook.py:221-232, configs/model_config.py:2501-2516, which lists KimiK25ForConditionalGeneration).
Not modelled (qverify's profiles set none of them): DP attention, DeepEP, pipeline parallelism, disaggregation,
post-capture KV sizing (off for MLA, srt/arg_groups/overrides.py:1809). tests/capacity/test_sglang_default.py
runs SGLang's own `adjust_mem_fraction_for_vlm` against this one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from qverify.capacity.weights import text_config

MIB = 2**20
# memory_hook.py:89-170: (total MiB below which the tier applies, chunked_prefill_size, decode max_bs at tp < 4, at tp >= 4)
_TIERS = ((20 * 1024, 2048, 8, 8), (35 * 1024, 4096, 48, 160), (60 * 1024, 4096, 32, 160),
          (90 * 1024, 8192, 256, 512), (160 * 1024, 8192, 256, 512), (float("inf"), 16384, 512, 512))
# configs/model_config.py:2501-2516: multimodal architectures that keep the breakable prefill graph
_BREAKABLE_MM = {"KimiK25ForConditionalGeneration", "KimiK3ForConditionalGeneration", "Qwen3_5ForConditionalGeneration",
                 "Qwen3_5MoeForConditionalGeneration", "Glm5NextForConditionalGeneration"}


@dataclass(frozen=True)
class Launch:
    """The launch flags SGLang's default depends on; None is SGLang's own default."""

    tp: int = 1
    chunked_prefill_size: int | None = None
    decode_max_bs: int | None = None
    max_running_requests: int | None = None
    cuda_graph: bool = True
    attention_backend: str | None = None

    @classmethod
    def from_flags(cls, tp: int, flags: dict[str, Any] | None) -> Launch:
        """From a profile's flags: its SGLang fields and the few of its extra_args this rule reads."""
        argv = [str(a) for a in (flags or {}).get("extra_args") or []]

        def arg(name: str) -> str | None:
            for i, a in enumerate(argv):
                if a == name and i + 1 < len(argv):
                    return argv[i + 1]
                if a.startswith(name + "="):
                    return a.split("=", 1)[1]
            return None

        num = lambda name: int(v) if (v := arg(name)) is not None else None
        return cls(tp=tp, chunked_prefill_size=num("--chunked-prefill-size"),
                   decode_max_bs=num("--cuda-graph-max-bs-decode") or num("--cuda-graph-max-bs"),
                   max_running_requests=num("--max-running-requests"), cuda_graph="--disable-cuda-graph" not in argv,
                   attention_backend=arg("--attention-backend"))


@dataclass(frozen=True)
class DefaultFraction:
    fraction: float
    reserved_mib: float
    vlm_factor: float  # 1.0 for a text-only model

    def how(self) -> str:
        vlm = f" x {self.vlm_factor:.3f} for the vision tower" if self.vlm_factor != 1 else ""
        return f"SGLang's default: {self.reserved_mib / 1024:.1f} GiB reserved{vlm}"


def default_fraction(hbm_bytes: int, config: dict[str, Any], launch: Launch, sm100: bool = True) -> DefaultFraction:
    """What SGLang 0.5.23 resolves --mem-fraction-static to for this model, GPU and launch (module docstring)."""
    total = hbm_bytes / MIB
    _, chunked, bs_small, bs_large = next(t for t in _TIERS if total < t[0])
    chunked = launch.chunked_prefill_size or chunked
    max_bs = launch.decode_max_bs or (bs_small if launch.tp < 4 else bs_large)
    if launch.max_running_requests is not None and launch.decode_max_bs is None:
        max_bs = min(max_bs, launch.max_running_requests)
    reserved = 512 + max(chunked, 2048) * 1.5 + launch.tp / 8 * 1024  # memory_hook.py:309-312 (pp = 1)
    if launch.cuda_graph:
        reserved += max_bs * 2 + _prefill_graph_mib(config, launch, chunked, sm100)
    if total > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((total - reserved) / total, 3)
    factor = vlm_factor(config)
    return DefaultFraction(fraction=fraction * factor, reserved_mib=reserved, vlm_factor=factor)


def _prefill_graph_mib(config: dict[str, Any], launch: Launch, chunked: int, sm100: bool) -> float:
    """reserve_for_graph_mb's prefill term (memory_hook.py:380-389), where the prefill graph stays on."""
    archs = set(config.get("architectures") or [])
    multimodal = isinstance(config.get("vision_config"), dict)
    backend = launch.attention_backend or ("trtllm_mla" if sm100 else "fa3")
    if multimodal and not archs & _BREAKABLE_MM:
        return 0.0
    if "DeepseekV3ForCausalLM" in archs and backend == "trtllm_mla":
        return 0.0
    if text_config(config).get("kv_lora_rank"):
        return 1.5 * 1024
    sizes = [s for s in (*range(4, 33, 4), *range(48, 257, 16), *range(288, 513, 32), *range(576, 1025, 64),
                         *range(1280, 4097, 256), *range(4608, chunked + 1, 512)) if s <= chunked]
    return len(sizes) * 8  # cuda_graph_hook.py:480-497 `generate_prefill_cuda_graph_batch_sizes`, 8 MiB each


def vlm_factor(config: dict[str, Any]) -> float:
    """`adjust_mem_fraction_for_vlm` (memory_hook.py:432-462) without post-capture sizing; 1.0 without a vision tower."""
    vision = config.get("vision_config")
    if not isinstance(vision, dict):
        return 1.0
    ratio = int(vision.get("num_hidden_layers", 24)) * int(vision.get("hidden_size", 1024)) ** 2 / (24 * 1024**2)
    return 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (ratio - 1.0)))
