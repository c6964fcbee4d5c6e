"""plan(): weights per GPU, SGLang's KV pool, KV tokens per replica and sessions at a context length.

The pool is SGLang 0.5.23's own arithmetic (qverify/capacity/sglang_pool.py). Every figure comes with the
assumptions it rests on (CapacityPlan.assumptions) and the caveats worth reading before quoting it (.notes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from qverify.capacity import sglang_pool as sp
from qverify.capacity.gpus import GB, GIB
from qverify.capacity.gpus import gpu as gpu_spec
from qverify.capacity.kv import KV_BYTES, KVLayout, kv_layout
from qverify.capacity.published import fmt_tokens, is_kimi_k2_layout, kimi_article_notes
from qverify.capacity.quantplan import QuantPlan, quant_plan, with_source
from qverify.capacity.sglang_default import Launch, default_fraction
from qverify.capacity.weights import LINEAR_CLASSES, WeightsEstimate, estimate_weights, text_config
from qverify.errors import BadInput
from qverify.strict import Record  # what the planner computes (Strict's key rule, nan/inf allowed)


class KVOption(Record):
    kv_dtype: str
    bytes_per_token: int  # target model, one replica's worth of one token
    rank_bytes_per_token: int  # what one GPU stores per token, drafter's share included: the divisor of capacity
    formula: str
    tokens_per_replica: int
    sessions: int
    selected: bool


class Margin(Record):
    """How far the figure is from changing: what a reader needs before quoting it."""

    spare_tokens: int  # KV tokens beyond the whole sessions
    tokens_per_gib_context: int  # KV tokens each GiB of CUDA context/NCCL over the assumed figure costs
    fits_from_fraction: float  # the smallest mem_fraction_static that leaves any pool
    one_session_from_fraction: float  # ... that holds one session of the context


class CapacityPlan(Record):
    model: str
    recipe: str
    gpu: str
    hbm_bytes: int
    tp: int
    mem_fraction: float
    mem_fraction_source: str
    cuda_context_bytes: int
    pre_model_load_bytes: int  # free per GPU before weights load: HBM - CUDA context/NCCL
    slack_bytes: int  # pre_model_load x (1 - mem_fraction): SGLang keeps it out of the pool
    context_tokens: int
    weights: WeightsEstimate
    drafter_weights_bytes: int = 0
    replicated_extra_per_gpu_bytes: int  # what TP-replicated modules add over an even split
    weights_per_gpu_bytes: int
    mla_copies_per_gpu_bytes: int = 0  # SGLang's w_kc/w_vc copies of kv_b_proj, loaded beside the weights
    free_per_gpu_bytes: int  # the KV pool per GPU
    fits: bool
    kv_dtype: str
    kv: list[KVOption]
    kv_tokens_per_replica: int
    sessions_at_context: int
    margin: Margin
    assumptions: list[str]
    notes: list[str]


def _drafter_weights(drafter_config: dict[str, Any], scheme: str) -> WeightsEstimate:
    # llm-compressor recipes quantize the drafter's Linear layers but ignore lm_head
    return estimate_weights(drafter_config, {c: scheme for c in LINEAR_CLASSES if c != "lm_head"})


def plan(
    config: dict[str, Any],
    quant: QuantPlan | str = "bf16",
    *,
    gpu: str = "b200",
    tp: int = 1,
    mem_fraction: float | None = None,
    mem_fraction_source: str | None = None,
    launch_flags: dict[str, Any] | None = None,
    cuda_context_gb: float | None = None,
    context: int = 100_000,
    weights: WeightsEstimate | None = None,
    weights_gb: float | None = None,
    hbm_gb: float | None = None,
    drafter_config: dict[str, Any] | None = None,
    drafter_weights: WeightsEstimate | None = None,
    model_name: str | None = None,
) -> CapacityPlan:
    """Plan one replica of `config` under `quant` on `tp` GPUs of type `gpu`, as SGLang sizes its KV pool.

    mem_fraction=None is SGLang's own default for this model and `launch_flags` (a serving profile's flags;
    qverify/capacity/sglang_default.py); a profile's mem_fraction_static is passed here (qverify capacity
    --profile). `weights` (from a checkpoint) or `weights_gb` replace the estimate; replicated modules are still
    counted from the config.
    """
    qp = with_source(quant_plan(quant) if isinstance(quant, str) else quant, config)
    _check_inputs(tp, mem_fraction, context, cuda_context_gb, weights_gb)
    spec = gpu_spec(gpu, hbm_gb)
    if mem_fraction is not None:
        fraction, source = mem_fraction, mem_fraction_source or "given"
    else:
        default = default_fraction(spec.hbm_bytes, config, Launch.from_flags(tp, launch_flags), sm100=spec.name != "h200"
                                   and spec.name != "h100")
        fraction, source = default.fraction, default.how()
    cuda_ctx = sp.CUDA_CONTEXT_BYTES if cuda_context_gb is None else round(cuda_context_gb * GB)
    w, dw = _weights(config, qp, weights, weights_gb, drafter_config, drafter_weights)
    mem = _memory(config, qp, tp, spec.hbm_bytes - cuda_ctx, fraction, w, dw, drafter_config)
    layout = kv_layout(config)
    draft_layers = int(text_config(drafter_config).get("num_hidden_layers") or 1) if drafter_config else 0
    options = _kv_options(layout, mem, tp, draft_layers, context, qp.kv_dtype)
    chosen = next(o for o in options if o.selected)
    cfg = text_config(config)
    name = model_name or str(config.get("_name_or_path") or cfg.get("_name_or_path") or cfg.get("model_type") or "model")
    assumptions = _assumptions(spec, qp, w, layout, chosen, mem, source, cuda_context_gb is None, tp, draft_layers)
    margin = _margin(chosen, mem, fraction, context)
    notes = _notes(config, qp, layout.kind, tp, mem.free, mem.pre, fraction, mem.per_gpu + mem.copies, options, context,
                   drafter_config, margin)
    return CapacityPlan(
        model=name, recipe=qp.name, gpu=spec.name, hbm_bytes=spec.hbm_bytes, tp=tp, mem_fraction=fraction,
        mem_fraction_source=source, cuda_context_bytes=cuda_ctx, pre_model_load_bytes=mem.pre,
        slack_bytes=int(mem.pre * (1 - fraction)), context_tokens=context, weights=w,
        drafter_weights_bytes=dw.total_bytes if dw else 0, replicated_extra_per_gpu_bytes=mem.extra,
        weights_per_gpu_bytes=mem.per_gpu, mla_copies_per_gpu_bytes=mem.copies, free_per_gpu_bytes=mem.free,
        fits=mem.free > 0, kv_dtype=qp.kv_dtype, kv=options, kv_tokens_per_replica=chosen.tokens_per_replica,
        sessions_at_context=chosen.sessions, margin=margin, assumptions=assumptions,
        notes=notes,
    )


def _check_inputs(tp: int, mem_fraction: float | None, context: int, cuda_context_gb: float | None,
                  weights_gb: float | None) -> None:
    if tp < 1:
        raise BadInput(f"--tp must be at least 1, got {tp}", fix="pass the tensor-parallel size, e.g. --tp 4")
    if mem_fraction is not None and not 0 < mem_fraction <= 1:
        raise BadInput(f"--mem-fraction must be in (0, 1], got {mem_fraction}", fix="e.g. --mem-fraction 0.85")
    if context < 1:
        raise BadInput(f"--context must be positive, got {context}", fix="e.g. --context 100k")
    if cuda_context_gb is not None and cuda_context_gb < 0:
        raise BadInput(f"--cuda-context-gb must be >= 0, got {cuda_context_gb}", fix="e.g. --cuda-context-gb 2.5")
    if weights_gb is not None and weights_gb <= 0:
        raise BadInput(f"--weights-gb must be positive, got {weights_gb}", fix="e.g. --weights-gb 595")


def _weights(config: dict[str, Any], qp: QuantPlan, weights: WeightsEstimate | None, weights_gb: float | None,
             drafter_config: dict[str, Any] | None, drafter_weights: WeightsEstimate | None
             ) -> tuple[WeightsEstimate, WeightsEstimate | None]:
    """The target's weights (given, from a checkpoint, or estimated) and the drafter's."""
    if weights_gb is not None:
        w = WeightsEstimate(total_bytes=round(weights_gb * GB), source="override")
    else:
        w = weights or estimate_weights(config, qp.schemes)
    return w, drafter_weights or (_drafter_weights(drafter_config, qp.drafter_scheme) if drafter_config else None)


@dataclass(frozen=True)
class _Memory:
    pre: int  # free per GPU before load
    replicated: int  # bytes of the TP-replicated modules, once
    extra: int  # what they add per GPU over an even split
    per_gpu: int  # weights per GPU (target + drafter)
    copies: int  # SGLang's w_kc/w_vc copies per GPU
    multimodal: int  # SGLANG_VLM_CACHE_SIZE_MB, reserved out of the pool for a multimodal model
    free: int  # the KV pool per GPU


def _memory(config: dict[str, Any], qp: QuantPlan, tp: int, pre: int, fraction: float, w: WeightsEstimate,
            dw: WeightsEstimate | None, drafter_config: dict[str, Any] | None) -> _Memory:
    """Per GPU: weights (replicated modules whole on every rank), SGLang's load-time copies, and the pool."""
    # the totals hold each replicated module once; every rank holds it whole instead of a 1/tp share
    replicated = sp.replicated_bytes(config, qp.schemes.get("attention", "bf16")) + (
        sp.replicated_bytes(drafter_config) if drafter_config else 0)
    extra = replicated - replicated // tp
    per_gpu = (w.total_bytes + (dw.total_bytes if dw else 0)) // tp + extra
    copies = sp.absorbed_copies_bytes(config, tp) + (sp.absorbed_copies_bytes(drafter_config, tp) if drafter_config else 0)
    multimodal = isinstance(config.get("vision_config"), dict)
    free = sp.pool_bytes(pre, per_gpu + copies, fraction, multimodal)
    return _Memory(pre=pre, replicated=replicated, extra=extra, per_gpu=per_gpu, copies=copies,
                   multimodal=sp.VLM_CACHE_BYTES if multimodal else 0, free=free)


def _kv_options(layout: KVLayout, mem: _Memory, tp: int, draft_layers: int, context: int, kv_dtype: str) -> list[KVOption]:
    options = []
    for dtype in KV_BYTES:
        rank_bpt = sp.cell_bytes(layout.rank_bytes_per_token(dtype, tp), layout.layers, draft_layers)
        tokens = max(mem.free, 0) // rank_bpt
        options.append(KVOption(kv_dtype=dtype, bytes_per_token=layout.bytes_per_token(dtype), rank_bytes_per_token=rank_bpt,
                                formula=layout.formula(dtype), tokens_per_replica=tokens, sessions=tokens // context,
                                selected=dtype == kv_dtype))
    return options


def _margin(chosen: KVOption, mem: _Memory, fraction: float, context: int) -> Margin:
    """How close the figure is to the next session up or down, and what the assumed CUDA context is worth: each
    GiB more of it takes `fraction` GiB out of the pool (pool = pre-load free x fraction - loaded - multimodal)."""
    fits_from = (mem.per_gpu + mem.copies + mem.multimodal) / mem.pre  # the pool is > 0 above this fraction
    return Margin(spare_tokens=chosen.tokens_per_replica - chosen.sessions * context,
                  tokens_per_gib_context=int(fraction * GIB // chosen.rank_bytes_per_token),
                  fits_from_fraction=math.ceil(fits_from * 1000) / 1000,
                  one_session_from_fraction=math.ceil((fits_from + context * chosen.rank_bytes_per_token / mem.pre) * 1000) / 1000)


def _assumptions(spec, qp: QuantPlan, w: WeightsEstimate, layout: KVLayout, chosen: KVOption, mem: _Memory, source: str,
                 assumed_context: bool, tp: int, draft_layers: int) -> list[str]:
    mla = layout.kind == "mla"
    return [
        f"HBM per {spec.name} GPU = {spec.hbm_bytes / GB:g} GB ({spec.source}); 1 GB = 10^9 bytes.",
        (f"SGLang's pool per GPU (mem_cache/kv_cache_configurator.py): free after load - pre-load free x (1 - "
         f"mem_fraction_static, {source}) - multimodal cache; pre-load free = HBM - CUDA context/NCCL "
         f"{(spec.hbm_bytes - mem.pre) / GIB:.2f} GiB (" + ("assumed, not measured; --cuda-context-gb replaces it)."
                                                           if assumed_context else "given).")
         + (f" Multimodal: {mem.multimodal // sp.MIB} MiB (SGLANG_VLM_CACHE_SIZE_MB, srt/environ.py)." if mem.multimodal
            else "")),
        (f"Weights split evenly over the {tp} TP rank(s), except what SGLang replicates on every rank (MLA "
         f"fused_qkv_a_proj_with_mqa, router, norms, the vision tower's MLPs and projector, an EAGLE3 head's fc): "
         f"{mem.replicated / GB:.2f} GB, {mem.extra / GB:.2f} GB per GPU over an even split."),
        {"config+recipe": f"Weights estimated from config.json and recipe {qp.name!r}: params per module class x scheme bytes, "
                          "block scales included.",
         "checkpoint": "Weights are the tensor bytes in the checkpoint's safetensors headers.",
         "override": "Weights given by --weights-gb."}[w.source],
        *([(f"SGLang's loader keeps bf16 w_kc/w_vc copies of kv_b_proj (models/deepseek_common/deepseek_weight_loader.py): "
            f"{mem.copies / GB:.2f} GB per GPU.")] if mla else []),
        (f"DP-attention off: every TP rank stores the whole MLA latent ({layout.formula(qp.kv_dtype)} = "
         f"{chosen.bytes_per_token:,} B per token)." if mla else
         f"GQA: {layout.formula(qp.kv_dtype)} = {chosen.bytes_per_token:,} B per token; TP shards the {layout.kv_heads} "
         f"KV heads (replicated once tp > kv_heads).")
        + (f" The drafter's {draft_layers} layer(s) add {chosen.rank_bytes_per_token - layout.rank_bytes_per_token(qp.kv_dtype, tp):,} "
           "B per token, priced as SGLang does: the target's per-layer KV." if draft_layers else ""),
        f"KV dtype {qp.kv_dtype} (recipe {qp.name!r}, {qp.source}); FP8 KV scales are per tensor and not counted.",
        "No prefix sharing or hierarchical (host) cache; sessions = KV tokens // context.",
    ]


def _notes(config: dict[str, Any], qp: QuantPlan, kind: str, tp: int, free: int, pre: int, fraction: float, per_gpu: int,
           options: list[KVOption], context: int, drafter_config: dict[str, Any] | None, margin: Margin) -> list[str]:
    cfg = text_config(config)
    notes: list[str] = []
    budget = pre * fraction  # what weights and pool share: free after load - slack > 0 <=> weights < pre x fraction
    if free <= 0:
        need = next((t for t in (1, 2, 4, 8, 16, 32, 64) if per_gpu * tp / t < budget), None)
        fix = f"TP {need} would fit" if need else "no TP up to 64 fits"
        by_fraction = (f"it would fit from --mem-fraction-static {margin.fits_from_fraction:g} (one session of "
                       f"{context:,} tokens from {margin.one_session_from_fraction:g}), or " if margin.fits_from_fraction < 1
                       else "")
        notes.append(f"Does not fit: {per_gpu / GB:.1f} GB of weights per GPU exceed the {budget / GB:.1f} GB that "
                     f"mem_fraction_static {fraction:.3f} leaves for weights and KV; {by_fraction}{fix}.")
    bf16, fp8 = options[0], options[1]
    notes.append(f"FP8 KV halves bytes per token ({bf16.rank_bytes_per_token:,} -> {fp8.rank_bytes_per_token:,} B per GPU), "
                 f"so {fmt_tokens(bf16.tokens_per_replica)} -> {fmt_tokens(fp8.tokens_per_replica)} tokens per replica.")
    if kind == "mla" and tp > 1:
        notes.append("Under TP the MLA latent is replicated, not sharded: more GPUs add KV room only by spreading the weights.")
    notes.append("Limits: the CUDA context/NCCL figure is assumed; load-time buffers SGLang keeps (attention "
                 "workspaces, CUDA-graph pools) come out of the reserve, not the pool, and are not counted; the token count is not floored to the page size "
                 "(64 for trtllm_mla). Expect SGLang's "
                 "max_total_num_tokens within about 10%; benchmarks/gpu/sglang_smoke.sh checks that on a GPU.")
    max_pos = cfg.get("max_position_embeddings")
    if max_pos and context > int(max_pos):
        notes.append(f"--context {context:,} exceeds the model's max_position_embeddings {int(max_pos):,}.")
    if cfg.get("num_nextn_predict_layers"):
        notes.append("The config has MTP (nextn) layers; their weights and KV are not counted.")
    if qp.drafter_scheme != "bf16" and not drafter_config:
        notes.append(f"Recipe {qp.name!r} quantizes a drafter, but no drafter config was given, so no drafter is counted.")
    if is_kimi_k2_layout(config):
        notes += kimi_article_notes(config)
    return notes
