"""Published Kimi K2.6 capacity figures, recomputed from the config so the notes can check them.

The article: Kimi K2.6 with NVFP4 weights is 595 GB; BF16 MLA KV is "72 KB" a token;
on B200s (180 GB) TP8 holds "3.0M tokens, 6x TP4". Its arithmetic uses the whole
nominal HBM with no activation reserve, and splits the weights evenly over TP.
"""

from __future__ import annotations

from typing import Any

from qverify.capacity.gpus import GB, HBM_GB
from qverify.capacity.kv import kv_layout
from qverify.capacity.weights import estimate_weights, text_config, vision_params

ARTICLE_WEIGHTS_GB = 595.0
ARTICLE_GPU = "b200"


def fmt_tokens(n: float) -> str:
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e5:
        return f"{n / 1e6:.3f}M"
    return f"{n / 1e3:.1f}k" if n >= 1e3 else f"{int(n)}"


def is_kimi_k2_layout(config: dict[str, Any]) -> bool:
    cfg = text_config(config)
    want = {"num_hidden_layers": 61, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "hidden_size": 7168, "n_routed_experts": 384}
    return all(cfg.get(k) == v for k, v in want.items())


def article_tokens(config: dict[str, Any], tp: int, kv_dtype: str) -> tuple[float, float]:
    """(free bytes per GPU, KV tokens per replica) under the article's arithmetic."""
    free = HBM_GB[ARTICLE_GPU] * GB - ARTICLE_WEIGHTS_GB * GB / tp
    return free, free / kv_layout(config).bytes_per_token(kv_dtype)


def kimi_article_notes(config: dict[str, Any]) -> list[str]:
    layout = kv_layout(config)
    bf16, fp8 = layout.bytes_per_token("bf16"), layout.bytes_per_token("fp8")
    free4, t4b = article_tokens(config, 4, "bf16")
    free8, t8b = article_tokens(config, 8, "bf16")
    _, t4f = article_tokens(config, 4, "fp8")
    _, t8f = article_tokens(config, 8, "fp8")
    experts = estimate_weights(config, {"routed_experts": "nvfp4"}).total_bytes / GB
    with_shared = estimate_weights(config, {"routed_experts": "nvfp4", "shared_experts": "nvfp4"}).total_bytes / GB
    vision = 2 * sum(vision_params(config)) / GB
    return [
        (
            f"Kimi K2.6 article check: BF16 KV = {layout.formula('bf16')} = {bf16:,} B/token (the article's '72 KB'); "
            f"FP8 KV halves it to {fp8:,} B/token."
        ),
        (
            f"At the article's arithmetic ({ARTICLE_WEIGHTS_GB:.0f} GB weights split over TP, all {HBM_GB[ARTICLE_GPU]:.0f} GB "
            f"of a B200, no reserve): TP4 leaves {free4 / GB:.2f} GB/GPU -> {fmt_tokens(t4b)} tokens BF16, {fmt_tokens(t4f)} FP8; "
            f"TP8 leaves {free8 / GB:.2f} GB/GPU -> {fmt_tokens(t8b)} BF16, {fmt_tokens(t8f)} FP8."
        ),
        (
            f"The article's 'TP8: 3.0M tokens, 6x TP4' matches the FP8-KV figure ({fmt_tokens(t8f)}), not BF16 ({fmt_tokens(t8b)}). "
            f"3.0M / TP4's BF16 {fmt_tokens(t4b)} = {t8f / t4b:.1f}x compares FP8 at TP8 with BF16 at TP4; "
            f"at one KV dtype TP8 holds {t8b / t4b:.1f}x TP4's tokens."
        ),
        (
            f"595 GB matches NVFP4 routed experts with everything else BF16: this config gives {experts:.1f} GB "
            f"(recipe nvfp4_experts), {vision:.2f} GB of it the MoonViT vision tower; NVFP4 shared experts too would give "
            f"{with_shared:.1f} GB. Moonshot's shipped INT4 group-32 experts (int4_experts) cost the same 4.5 bits a "
            "weight, so the same figure."
        ),
    ]
