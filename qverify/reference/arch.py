"""Architectures of qverify-tiny (DeepSeek-V3 layout) and its drafter."""

from __future__ import annotations

from transformers import DeepseekV3Config


def target_config(vocab_size: int, bos: int, eos: int, pad: int, max_pos: int = 2048) -> DeepseekV3Config:
    # MLA with the real model's kv_lora_rank 512 + qk_rope 64 (576 KV values/token/layer),
    # so KV math, FP8-KV scales and SGLang's MLA kernels apply unchanged. Small hidden size
    # for speed: an earlier 7.5M-param probe learned no copying in 13 min; this one did in 2.
    return DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=128, intermediate_size=384, moe_intermediate_size=128,
        num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4,
        n_shared_experts=1, n_routed_experts=8, num_experts_per_tok=2, first_k_dense_replace=1,
        n_group=1, topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=True,
        kv_lora_rank=512, q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=32, v_head_dim=32,
        max_position_embeddings=max_pos, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False,
        num_mtp_layers=0,
    )


def drafter_config(vocab_size: int, bos: int, eos: int, pad: int, max_pos: int = 2048) -> DeepseekV3Config:
    # Two dense layers: one layer cannot form an induction head, and copying is most of the task.
    return DeepseekV3Config(
        vocab_size=vocab_size, hidden_size=96, intermediate_size=256, moe_intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
        n_shared_experts=1, n_routed_experts=2, num_experts_per_tok=1, first_k_dense_replace=2,
        n_group=1, topk_group=1, kv_lora_rank=128, q_lora_rank=None, qk_rope_head_dim=32,
        qk_nope_head_dim=32, v_head_dim=32, max_position_embeddings=max_pos,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        bos_token_id=bos, eos_token_id=eos, pad_token_id=pad, tie_word_embeddings=False, num_mtp_layers=0,
    )


def param_counts(model) -> dict[str, int]:
    """Total and active parameters (active: shared + top-k of the routed experts)."""
    total = sum(p.numel() for p in model.parameters())
    cfg = model.config
    routed = sum(p.numel() for n, p in model.named_parameters() if ".experts." in n and "shared" not in n)
    active = total - routed + (routed * cfg.num_experts_per_tok // max(cfg.n_routed_experts, 1))
    return {"total": total, "active": active}
