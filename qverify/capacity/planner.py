"""plan(): weights per GPU, free HBM, KV tokens per replica and sessions at a context length.

Every figure comes with the assumptions it rests on (CapacityPlan.assumptions) and the
caveats worth reading before quoting it (CapacityPlan.notes).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from qverify.capacity.gpus import GB, GIB
from qverify.capacity.gpus import gpu as gpu_spec
from qverify.capacity.kv import KV_BYTES, kv_layout
from qverify.capacity.published import fmt_tokens, is_kimi_k2_layout, kimi_article_notes
from qverify.capacity.quantplan import QuantPlan, quant_plan, with_source
from qverify.capacity.weights import LINEAR_CLASSES, WeightsEstimate, estimate_weights, text_config
from qverify.errors import BadInput

# SGLang (srt/arg_groups/memory_hook.py) keeps at least 10 GiB out of its static pool on
# GPUs over 60 GB for activations and CUDA graphs: mem_fraction_static = (HBM - reserve) / HBM.
SGLANG_RESERVE_BYTES = 10 * GIB


class KVOption(BaseModel):
    model_config = ConfigDict(extra="forbid")

    kv_dtype: str
    bytes_per_token: int  # whole model, one replica's worth of one token
    rank_bytes_per_token: int  # what one GPU stores per token: the divisor of capacity
    formula: str
    tokens_per_replica: int
    sessions: int
    selected: bool


class CapacityPlan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str
    recipe: str
    gpu: str
    hbm_bytes: int
    tp: int
    mem_fraction: float
    activation_reserve_bytes: int
    context_tokens: int
    weights: WeightsEstimate
    drafter_weights_bytes: int = 0
    weights_per_gpu_bytes: int
    static_budget_per_gpu_bytes: int
    free_per_gpu_bytes: int
    fits: bool
    kv_dtype: str
    kv: list[KVOption]
    kv_tokens_per_replica: int
    sessions_at_context: int
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
    mem_fraction: float = 1.0,
    activation_reserve_gb: float | None = None,
    context: int = 100_000,
    weights: WeightsEstimate | None = None,
    weights_gb: float | None = None,
    hbm_gb: float | None = None,
    drafter_config: dict[str, Any] | None = None,
    drafter_weights: WeightsEstimate | None = None,
    model_name: str | None = None,
) -> CapacityPlan:
    """Plan one replica of `config` under `quant` on `tp` GPUs of type `gpu`.

    activation_reserve_gb=None means SGLang's default: 10 GiB when mem_fraction is 1.0
    (SGLang derives its fraction from that reserve), else none (the fraction already
    leaves the room). `weights` (from a checkpoint) or `weights_gb` replace the estimate.
    """
    qp = with_source(quant_plan(quant) if isinstance(quant, str) else quant, config)
    if tp < 1:
        raise BadInput(f"--tp must be at least 1, got {tp}", fix="pass the tensor-parallel size, e.g. --tp 4")
    if not 0 < mem_fraction <= 1:
        raise BadInput(f"--mem-fraction must be in (0, 1], got {mem_fraction}", fix="e.g. --mem-fraction 0.9")
    if context < 1:
        raise BadInput(f"--context must be positive, got {context}", fix="e.g. --context 100k")
    spec = gpu_spec(gpu, hbm_gb)
    reserve_defaulted = activation_reserve_gb is None
    reserve = (SGLANG_RESERVE_BYTES if mem_fraction == 1.0 else 0) if reserve_defaulted else int(activation_reserve_gb * GB)
    if reserve < 0:
        raise BadInput(f"--reserve-gb must be >= 0, got {activation_reserve_gb}", fix="e.g. --reserve-gb 10")

    if weights_gb is not None:
        if weights_gb <= 0:
            raise BadInput(f"--weights-gb must be positive, got {weights_gb}", fix="e.g. --weights-gb 595")
        w = WeightsEstimate(total_bytes=round(weights_gb * GB), source="override")
    else:
        w = weights or estimate_weights(config, qp.schemes)
    dw = drafter_weights or (_drafter_weights(drafter_config, qp.drafter_scheme) if drafter_config else None)
    drafter_bytes = dw.total_bytes if dw else 0

    layout = kv_layout(config)
    draft_layout = kv_layout(drafter_config) if drafter_config else None
    per_gpu_weights = (w.total_bytes + drafter_bytes) // tp
    budget = int(spec.hbm_bytes * mem_fraction) - reserve
    free = budget - per_gpu_weights
    options = []
    for dtype in KV_BYTES:
        rank_bpt = layout.rank_bytes_per_token(dtype, tp) + (draft_layout.rank_bytes_per_token(dtype, tp) if draft_layout else 0)
        tokens = max(free, 0) // rank_bpt
        options.append(KVOption(kv_dtype=dtype, bytes_per_token=layout.bytes_per_token(dtype), rank_bytes_per_token=rank_bpt,
                                formula=layout.formula(dtype), tokens_per_replica=tokens, sessions=tokens // context,
                                selected=dtype == qp.kv_dtype))
    chosen = next(o for o in options if o.selected)
    cfg = text_config(config)
    name = model_name or str(config.get("_name_or_path") or cfg.get("_name_or_path") or cfg.get("model_type") or "model")

    assumptions = [
        f"HBM per {spec.name} GPU = {spec.hbm_bytes / GB:g} GB ({spec.source}); 1 GB = 10^9 bytes.",
        f"Static pool per GPU = HBM x mem_fraction {mem_fraction:g} - activation reserve {reserve / GB:.2f} GB"
        + (" (SGLang's floor for >60 GB GPUs: 10 GiB for activations and CUDA graphs)." if reserve_defaulted and reserve else "."),
        f"Weights split evenly over the {tp} TP rank(s); replicated norms and router weights are ignored.",
        {"config+recipe": f"Weights estimated from config.json and recipe {qp.name!r}: params per module class x scheme bytes, "
                          "block scales included.",
         "checkpoint": "Weights are the tensor bytes in the checkpoint's safetensors headers.",
         "override": "Weights given by --weights-gb."}[w.source],
        (f"DP-attention off: every TP rank stores the whole MLA latent, so KV capacity per replica = free memory per GPU / "
         f"({layout.formula(qp.kv_dtype)} = {chosen.bytes_per_token:,} B) per token." if layout.kind == "mla" else
         f"GQA: {layout.formula(qp.kv_dtype)} = {chosen.bytes_per_token:,} B per token; TP shards the {layout.kv_heads} "
         f"KV heads (replicated once tp > kv_heads), so a rank stores {chosen.rank_bytes_per_token:,} B per token."),
        f"KV dtype {qp.kv_dtype} (recipe {qp.name!r}, {qp.source}); FP8 KV scales are per tensor and not counted.",
        "No paging overhead, prefix sharing or hierarchical (host) cache; sessions = KV tokens // context.",
    ]
    notes = _notes(config, qp, layout.kind, tp, free, budget, per_gpu_weights, options, context, drafter_config)
    return CapacityPlan(
        model=name, recipe=qp.name, gpu=spec.name, hbm_bytes=spec.hbm_bytes, tp=tp, mem_fraction=mem_fraction,
        activation_reserve_bytes=reserve, context_tokens=context, weights=w, drafter_weights_bytes=drafter_bytes,
        weights_per_gpu_bytes=per_gpu_weights, static_budget_per_gpu_bytes=budget, free_per_gpu_bytes=free,
        fits=free > 0, kv_dtype=qp.kv_dtype, kv=options, kv_tokens_per_replica=chosen.tokens_per_replica,
        sessions_at_context=chosen.sessions, assumptions=assumptions, notes=notes,
    )


def _notes(config: dict[str, Any], qp: QuantPlan, kind: str, tp: int, free: int, budget: int, per_gpu: int,
           options: list[KVOption], context: int, drafter_config: dict[str, Any] | None) -> list[str]:
    cfg = text_config(config)
    notes: list[str] = []
    if free <= 0:
        need = next((t for t in (1, 2, 4, 8, 16, 32, 64) if per_gpu * tp / t < budget), None)
        fix = f"TP {need} would fit" if need else "no TP up to 64 fits"
        notes.append(f"Does not fit: {per_gpu / GB:.1f} GB of weights per GPU exceed the {budget / GB:.1f} GB static pool ({fix}).")
    bf16, fp8 = options[0], options[1]
    notes.append(f"FP8 KV halves bytes per token ({bf16.rank_bytes_per_token:,} -> {fp8.rank_bytes_per_token:,} B per GPU), "
                 f"so {fmt_tokens(bf16.tokens_per_replica)} -> {fmt_tokens(fp8.tokens_per_replica)} tokens per replica.")
    if kind == "mla" and tp > 1:
        notes.append("Under TP the MLA latent is replicated, not sharded: more GPUs add KV room only by spreading the weights.")
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
