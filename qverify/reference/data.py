"""Training examples from the suites' *train* split, rendered with the Kimi-K2 chat format.

Each example is (prompt tokens, answer tokens); the loss covers all tokens plus a
second term on answer tokens. Batches hold one task each (no packing), and the
schedule is an induction warm-up, then the task mix with long context ramped up.

Why the induction warm-up: every suite needs copying from the prompt (argument values,
needle values, names in a literal spec). The first run (12M tokens, copy warm-up over a
~100-word pool) never learned to copy: a unigram guess over a small pool is a comfortable
plateau (answer CE ~2.2). Sequences of *uniformly random token ids* repeated once leave no
such plateau (CE log|V| ~ 6.6 unless you copy) and this architecture forms induction heads
in ~1000 steps at lr 1e-3 (measured, batch 32, copy length varying per batch: 2nd-half
CE 6.65 → 0.13 at step 1000; at lr 3e-3 or 6e-3 it stays at chance for 1000 steps, and
with a *fixed* copy length it "learns" in 250 steps by attending to a fixed offset, which
does not transfer). The warm-up gives it ~1300 steps.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from qverify.chatfmt import IM_END, render_chat
from qverify.suites import longctx_gen, train_examples

TASK_MIX = {"coding": 0.30, "toolcall": 0.28, "longctx": 0.30, "copy": 0.04, "induction": 0.08}
INDUCTION_FRACTION = 0.20  # pure random-token induction first
WARMUP_FRACTION = 0.24  # then induction + chat-wrapped copy, then the task mix
LONGCTX_LENGTHS = (128, 256, 512, 768, 1024)


@dataclass
class Example:
    prompt: str
    answer: str


def _copy_example(rng: random.Random) -> Example:
    pool = longctx_gen.WORDS_A + longctx_gen.WORDS_B + longctx_gen.IDENTS + longctx_gen.VERBS
    parts = []
    for _ in range(rng.randint(6, 30)):
        r = rng.random()
        parts.append(str(rng.randint(0, 9999)) if r < 0.25 else (rng.choice(pool) if r < 0.8 else rng.choice("_./=,:()")))
    span = " ".join(parts)
    prompt = render_chat([{"role": "user", "content": f"Repeat exactly: {span}"}])
    return Example(prompt, span)


def examples(task: str, batch: int, seed: int, count_tokens, longctx_len: int = 256) -> list[Example]:
    rng = random.Random(f"train:{task}:{seed}")
    if task == "copy":
        return [_copy_example(rng) for _ in range(batch)]
    if task not in ("coding", "toolcall", "longctx"):
        raise ValueError(task)
    options = {"count_tokens": count_tokens, "lengths": [longctx_len]} if task == "longctx" else {}
    return [Example(p, a) for p, a in train_examples(task, batch, seed, **options)]


def corpus_for_tokenizer(n: int = 400) -> list[str]:
    """Text for training the BPE tokenizer: every task, prompt and answer."""
    out = []
    for s in range(n // 20):
        for task in ("coding", "toolcall", "copy"):
            out += [e.prompt + e.answer + IM_END for e in examples(task, 8, s, None)]
        out += [e.prompt + e.answer for e in examples("longctx", 2, s, None, 256)]
    return out


def induction_batch(batch: int, seed: int, vocab_lo: int, vocab_hi: int, sep_id: int):
    """(ids, valid, answer) tensors: [segment][sep][segment] of uniformly random token ids.

    The answer mask covers the second copy. The segment length varies from batch to batch
    so that only content-based copying (an induction head) lowers the loss, not attention
    to a fixed offset; the chat-wrapped copy task then carries it over to text.
    """
    import torch

    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(16, 33, (1,), generator=g))  # one length per batch: no padding
    seg = torch.randint(vocab_lo, vocab_hi, (batch, n), generator=g)
    ids = torch.cat([seg, torch.full((batch, 1), sep_id), seg], 1)
    valid = torch.ones_like(ids, dtype=torch.bool)
    ans = torch.zeros_like(ids, dtype=torch.bool)
    ans[:, n + 1:] = True
    return ids, valid, ans


def pick_task(rng: random.Random, progress: float) -> tuple[str, int]:
    """Task and long-context length for a batch, given training progress in [0, 1]."""
    if progress < INDUCTION_FRACTION:
        return "induction", 0
    if progress < WARMUP_FRACTION:
        return rng.choice(["induction", "copy"]), 0
    task = rng.choices(list(TASK_MIX), list(TASK_MIX.values()))[0]
    ramp = min(1.0, (progress - WARMUP_FRACTION) / 0.6)
    allowed = [L for L in LONGCTX_LENGTHS if L <= 128 + ramp * (LONGCTX_LENGTHS[-1] - 128)]
    return task, rng.choice(allowed)
