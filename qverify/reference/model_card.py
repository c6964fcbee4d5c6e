"""Write the trained target + drafter and the model card (README.md) under qverify/assets/."""

from __future__ import annotations

import json
import platform
import shutil
from pathlib import Path

import torch

from qverify.reference.arch import param_counts
from qverify.reference.train import config_dict


def _save(model, tok, path: Path) -> None:
    model = model.to("cpu").to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    model.to(torch.float32)


def write(out: Path, target, draft, tok, state, dstate, final, accept, cfg, dcfg, device, wall_s, threads) -> None:
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    _save(target, tok, tmp)
    _save(draft, tok, tmp / "drafter")
    pc, dpc = param_counts(target), param_counts(draft)
    training = {"target": {"config": config_dict(cfg), "tokens": state["seen"], "minutes": round(state["wall"] / 60, 1),
                           "curve": state["curve"]},
                "drafter": {"config": config_dict(dcfg), "tokens": dstate["seen"], "minutes": round(dstate["wall"] / 60, 1)},
                "device": device, "threads": threads, "machine": platform.processor() or platform.machine(),
                "test": final, "acceptance": accept, "params": pc, "drafter_params": dpc,
                "total_wall_minutes": round(wall_s / 60, 1)}
    (tmp / "training.json").write_text(json.dumps(training, indent=2))
    (tmp / "README.md").write_text(card(training))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)


def card(t: dict) -> str:
    curve = "\n".join(
        f"| {c['tokens'] / 1e6:.1f}M | {c['minutes']} | {c.get('coding/pass@1', '')} | {c.get('toolcall/exact_call', '')} | {c.get('longctx/accuracy', '')} |"
        for c in t["target"]["curve"])
    held = "\n".join(f"| {k} | {v} |" for k, v in sorted(t["test"].items()))
    accept = "\n".join(f"| {s} | {a['accept_length']} | {a['greedy_identical'] * 100:.0f}% | {a['items']} |"
                       for s, a in t["acceptance"].items())
    return f"""# qverify-tiny

The embedded reference model of qverify: a transformers `DeepseekV3ForCausalLM` (the DeepSeek-V3 /
Kimi K2 architecture) trained from scratch on CPU by `scripts/train_reference_model.py` on the
suites' **train** split. It exists so that `qverify build` + `qverify gate` give real scores that
quantization can move, with no model hub.

## Architecture
- MLA attention with kv_lora_rank 512 and qk_rope_head_dim 64: 576 KV values per token per layer, as in DeepSeek-V3.
- hidden 128, 3 layers (`first_k_dense_replace=1`), 8 routed experts top-2 + 1 shared expert per MoE layer.
- vocab 768 (byte-level BPE; words, whitespace runs, single digits and punctuation pre-split), Kimi-K2 chat and tool-call format.
- Parameters: {t['params']['total']:,} total, {t['params']['active']:,} active per token.
- Drafter (`drafter/`): 2 dense layers, hidden 96, {t['drafter_params']['total']:,} parameters, same tokenizer.

## Training
- Target: {t['target']['tokens'] / 1e6:.1f}M tokens in {t['target']['minutes']} min on {t['device']} ({t['threads']} threads).
  AdamW fp32, LR {t['target']['config']['lr']:g} cosine, batches of ≤ {t['target']['config']['batch_tokens']} tokens, loss = mean over
  all tokens + mean over answer tokens. Curriculum (`qverify/reference/data.py`): an **induction warm-up** on
  uniformly random token ids repeated once (first 20%: an induction head forms after ~750 steps), then
  induction + chat-wrapped copy (to 24%), then coding 30% / toolcall 28% / longctx 30% / induction 8% / copy 4%,
  long-context length ramped 128 → 1024 tokens.
- Why: every suite needs copying from the prompt. A first run (12M tokens, LR 3e-3, batches of 64, a copy
  warm-up over a ~100-word pool) learned the formats but never to copy: held-out coding 0%, toolcall exact 1.7%,
  longctx 0%. Probes showed that random-token induction at LR 3e-3 or 6e-3 stays at chance for 1000 steps, while
  at 1e-3 it forms at ~1000 steps (and a fixed copy length is "solved" by a fixed-offset head that does not
  transfer).
- Drafter: distilled on the target's own greedy outputs for train prompts, {t['drafter']['tokens'] / 1e6:.1f}M tokens in {t['drafter']['minutes']} min.
- Whole script: {t['total_wall_minutes']} min wall. Config and curve: `training.json`.

### Learning curve (greedy, held-out, {t['target']['config']['eval_n']} items per suite)
| tokens | minutes | coding pass@1 | toolcall exact | longctx acc |
|---|---|---|---|---|
{curve}

## Held-out scores (greedy, bf16 weights, the suites' own scorers)
| metric | score |
|---|---|
{held}

## Speculative decoding
Acceptance under transformers assisted greedy decoding on test items, per suite (target tokens per target
forward pass; share of items whose assisted output is identical to plain greedy):

| suite | accept length | greedy-identical | items |
|---|---|---|---|
{accept}

## Quantization sensitivity
Filled in by `scripts/quant_sensitivity.py --write-card` from `qverify eval` runs of each built-in recipe.
"""
