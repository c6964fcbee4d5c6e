"""KV-cache bytes per token, per model and per tensor-parallel rank.

MLA caches one compressed latent per layer: kv_lora_rank + qk_rope_head_dim values,
shared by all heads. Under tensor parallelism (DP-attention off) every rank keeps the
whole latent, so a rank's bytes/token equal the model's. GQA caches K and V per KV head;
TP shards the heads, and a rank holds max(1, kv_heads / tp) of them (replicated when
tp > kv_heads).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict

from qverify.capacity.weights import need, text_config
from qverify.strict import Strict

KVDtype = Literal["bf16", "fp8"]
KV_BYTES: dict[str, int] = {"bf16": 2, "fp8": 1}


class KVLayout(Strict):
    model_config = ConfigDict(frozen=True)  # Strict's rules, and hashable

    kind: Literal["mla", "gqa"]
    layers: int
    values_per_layer: int  # per token, whole model (MLA: latent + rope key; GQA: 2 * kv_heads * head_dim)
    kv_heads: int = 1  # GQA only; MLA's latent is one shared "head"

    def bytes_per_token(self, kv_dtype: str) -> int:
        return self.layers * self.values_per_layer * KV_BYTES[kv_dtype]

    def rank_bytes_per_token(self, kv_dtype: str, tp: int) -> int:
        """Bytes one TP rank stores per token of context."""
        if self.kind == "mla":
            return self.bytes_per_token(kv_dtype)
        heads_per_rank = max(1, -(-self.kv_heads // tp))  # ceil; replicated once tp > kv_heads
        return self.layers * (self.values_per_layer // self.kv_heads) * heads_per_rank * KV_BYTES[kv_dtype]

    def formula(self, kv_dtype: str) -> str:
        b = KV_BYTES[kv_dtype]
        if self.kind == "mla":
            return f"{self.layers} layers x {self.values_per_layer} (kv_lora_rank + qk_rope_head_dim) x {b} B"
        hd = self.values_per_layer // (2 * self.kv_heads)
        return f"2 x {self.layers} layers x {self.kv_heads} kv_heads x {hd} head_dim x {b} B"


def kv_layout(config: dict[str, Any]) -> KVLayout:
    cfg = text_config(config)
    layers = int(need(cfg, "num_hidden_layers"))
    if cfg.get("kv_lora_rank"):
        return KVLayout(kind="mla", layers=layers, values_per_layer=int(cfg["kv_lora_rank"]) + int(need(cfg, "qk_rope_head_dim")))
    heads = int(need(cfg, "num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or int(need(cfg, "hidden_size")) // heads)
    return KVLayout(kind="gqa", layers=layers, values_per_layer=2 * kv_heads * head_dim, kv_heads=kv_heads)


def kv_bytes_per_token(config: dict[str, Any], kv_dtype: str = "bf16") -> int:
    """Whole-model KV bytes per token: what BuildManifest.kv_bytes_per_token records."""
    return kv_layout(config).bytes_per_token(kv_dtype)
