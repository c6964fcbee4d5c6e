"""A tiny random-weight DeepSeek-V3 (+ drafter) with qverify-tiny's layout, for tests and benchmarks.

Same MLA geometry as the embedded model (kv_lora_rank 512, qk_rope 64) and the same MoE
shape (routed experts top-2 plus a shared expert), smaller hidden size; the tokenizer is
trained in a fraction of a second on the suites' train split.
"""

from __future__ import annotations

from pathlib import Path


def make_tiny_model(out: Path, hidden: int = 64, seed: int = 0) -> Path:
    """Write `out/` (target, tokenizer) and `out/drafter/`; returns `out`."""
    import torch
    from transformers import DeepseekV3ForCausalLM

    from qverify.reference import arch, data, tokenizer

    tok = tokenizer.train_tokenizer(data.corpus_for_tokenizer(40))
    ids = {"vocab_size": len(tok), "bos": tok.bos_token_id, "eos": tok.eos_token_id, "pad": tok.pad_token_id}
    cfg = arch.target_config(**ids)
    cfg.hidden_size, cfg.intermediate_size, cfg.moe_intermediate_size = hidden, 2 * hidden, hidden
    torch.manual_seed(seed)
    DeepseekV3ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(out)
    tok.save_pretrained(out)
    torch.manual_seed(seed + 1)
    DeepseekV3ForCausalLM(arch.drafter_config(**ids)).to(torch.bfloat16).save_pretrained(out / "drafter")
    tok.save_pretrained(out / "drafter")
    return out
