"""SGLang 0.5.23's KV pool, as arithmetic on given memory figures: what `max_total_num_tokens` will be.

SGLang measures, per GPU (the minimum over the TP ranks):
- `pre_model_load`: free memory after the CUDA context and NCCL are up, before any weight is loaded
  (srt/distributed/bootstrap.py `measure_pre_model_load_memory`);
- free memory after the target and drafter weights are loaded; the pool is that minus the non-static slack
  `pre_model_load * (1 - mem_fraction_static)` minus a multimodal reservation
  (srt/mem_cache/kv_cache_configurator.py `_profile_available_bytes`, `mm_runtime_reservation_gb`);
- tokens = pool // cell, the cell being one token's KV in every target layer plus the drafter's share, priced
  as `int(cell * draft_layers / target_layers)` for EAGLE and STANDALONE drafts
  (srt/model_executor/pool_configurator.py `DefaultPoolConfigurator.__init__`, `calculate_pool_sizes`).
MLA models skip SGLang's post-capture resizing (srt/arg_groups/overrides.py `post_capture_kv_sizing_planned`
returns False for MLA), so this pre-capture figure is the one `/server_info` reports for them.
tests/capacity/test_sglang_pool.py runs SGLang's own functions, cut from its source, on the same figures.
"""

from __future__ import annotations

from typing import Any

from qverify.capacity.gpus import GIB
from qverify.capacity.schemes import LinearShape, linear_bytes
from qverify.capacity.weights import _is_moe_layer, need, text_config, vision_params

MIB = 2**20
# Not measured here (no GPU has run qverify yet): torch's CUDA context (~0.5-1 GiB on Hopper/Blackwell) plus
# NCCL's and SGLang's custom all-reduce buffers at TP4-8 (SGLang's own heuristic reserves tp/8 GiB for "large
# parallel size", srt/arg_groups/memory_hook.py). The issue's ~2.5 GiB; SGLang logs the real figure at start
# ("Memory baseline taken. mem usage=..."), and --cuda-context-gb replaces it.
CUDA_CONTEXT_BYTES = int(2.5 * GIB)
# SGLANG_VLM_CACHE_SIZE_MB defaults to 100 (srt/environ.py): reserved out of the pool for a multimodal model
# (1 GiB more only with --mm-feature-transport cuda_ipc/cuda_vmm, which qverify's profiles do not set).
VLM_CACHE_BYTES = 100 * MIB


def pool_bytes(pre_model_load: int, weights_per_gpu: int, mem_fraction: float, multimodal: bool) -> int:
    """`_profile_available_bytes`: free after load - pre_model_load * (1 - mem_fraction) - multimodal reservation."""
    available = pre_model_load - weights_per_gpu
    slack = pre_model_load * (1 - mem_fraction)
    return int(available - slack - (VLM_CACHE_BYTES if multimodal else 0))


def absorbed_copies_bytes(config: dict[str, Any], tp: int) -> int:
    """Per GPU: the bf16 `w_kc` / `w_vc` copies of each layer's kv_b_proj SGLang's DeepSeek loader keeps beside it
    for MLA's absorbed decode (srt/models/deepseek_common/deepseek_weight_loader.py:762-819): heads/tp x
    kv_lora_rank x (qk_nope_head_dim + v_head_dim) x 2 B per layer, about 0.26 GB per GPU at K2.6 on TP4."""
    cfg = text_config(config)
    if not cfg.get("kv_lora_rank"):
        return 0
    heads = -(-int(need(cfg, "num_attention_heads")) // tp)
    width = int(need(cfg, "qk_nope_head_dim")) + int(need(cfg, "v_head_dim"))
    return int(need(cfg, "num_hidden_layers")) * heads * int(cfg["kv_lora_rank"]) * width * 2


def cell_bytes(target_cell: int, target_layers: int, draft_layers: int) -> int:
    """One token's KV on one GPU with the drafter's share added as SGLang prices it (the draft is assumed to
    share the target's per-layer KV size, whatever its own attention)."""
    if draft_layers > 0:
        return target_cell + int(target_cell * draft_layers / target_layers)
    return target_cell


def replicated_bytes(config: dict[str, Any], attention_scheme: str = "bf16") -> int:
    """Bytes of the modules SGLang keeps whole on every TP rank, which an even split of the weights misses.

    MLA: `fused_qkv_a_proj_with_mqa` (q_a_proj + kv_a_proj_with_mqa, a ReplicatedLinear; deepseek_v2.py
    `DeepseekV2AttentionMLA`; only kv_a_proj_with_mqa without q_lora_rank) and its two RMSNorms; MoE: the router
    `MoEGate.weight` (a plain nn.Parameter) and its fp32 correction bias; every layer's norms; the vision tower's
    replicated part (weights.vision_params). An EAGLE3 head: its `fc` (llama_eagle3.py: a plain nn.Linear) and,
    for the MLA head (kimi_k25_eagle3.py), a fused_qkv_a_proj over the doubled input width.
    """
    cfg = text_config(config)
    hidden, layers = int(need(cfg, "hidden_size")), int(need(cfg, "num_hidden_layers"))
    eagle3 = any("eagle3" in a.lower() for a in config.get("architectures") or [])
    total = 2 * hidden * (2 * layers + 1)  # input/post-attention norms per layer, final norm (bf16)
    if cfg.get("kv_lora_rank"):
        q_rank = int(cfg.get("q_lora_rank") or 0)
        out = q_rank + int(cfg["kv_lora_rank"]) + int(need(cfg, "qk_rope_head_dim"))
        width = 2 * hidden if eagle3 else hidden
        total += layers * (linear_bytes(LinearShape(out_features=out, in_features=width), attention_scheme)
                           + 2 * (q_rank + int(cfg["kv_lora_rank"])))
    n_routed = int(cfg.get("n_routed_experts") or 0)
    moe_layers = sum(_is_moe_layer(cfg, i, n_routed) for i in range(layers))
    total += moe_layers * n_routed * (2 * hidden + (4 if cfg.get("topk_method", "noaux_tc") == "noaux_tc" else 0))
    if eagle3 and not cfg.get("kv_lora_rank"):
        aux = len((cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids") or [0, 0, 0])
        target_hidden = int(cfg.get("target_hidden_size") or hidden)
        total += 2 * aux * target_hidden * hidden  # fc stays bf16 in every qverify build (quantize/eagle3.py)
    return total + 2 * vision_params(config)[1]
