"""Training examples from the suites' *train* split, rendered with the Kimi-K2 chat format.

Each example is (prompt tokens, answer tokens); the loss covers all tokens plus a
second term on answer tokens. Batches hold one task each (no packing), and the
schedule is a copy warm-up, then the task mix with long context ramped up.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from qverify.chatfmt import IM_END, render_chat
from qverify.suites import longctx_gen
from qverify.suites.coding import CodingSuite
from qverify.suites.longctx import LongContextSuite
from qverify.suites.toolcall import generate_toolcall_items, reference_message

TASK_MIX = {"coding": 0.30, "toolcall": 0.30, "longctx": 0.35, "copy": 0.05}
WARMUP_FRACTION = 0.12
LONGCTX_LENGTHS = (128, 256, 512, 768, 1024)


@dataclass
class Example:
    prompt: str
    answer: str


def answer_text(item) -> str:
    if item.suite == "coding":
        return item.target["reference"]
    if item.suite == "longctx":
        return "\n".join(item.target["answer"])
    msg = reference_message(item)
    if msg.get("tool_calls"):
        return render_chat([msg], None, add_generation_prompt=False).split("<|im_middle|>", 1)[1][: -len(IM_END)]
    return msg["content"]


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
    if task == "coding":
        items = CodingSuite().items("train", batch, seed)
    elif task == "toolcall":
        items = generate_toolcall_items("toolcall", "train", batch, seed)
    elif task == "longctx":
        items = LongContextSuite(count_tokens=count_tokens, lengths=[longctx_len]).items("train", batch, seed)
    else:
        raise ValueError(task)
    return [Example(render_chat(i.messages, i.tools), answer_text(i)) for i in items]


def corpus_for_tokenizer(n: int = 400) -> list[str]:
    """Text for training the BPE tokenizer: every task, prompt and answer."""
    out = []
    for s in range(n // 20):
        for task in ("coding", "toolcall", "copy"):
            out += [e.prompt + e.answer + IM_END for e in examples(task, 8, s, None)]
        out += [e.prompt + e.answer for e in examples("longctx", 2, s, None, 256)]
    return out


def pick_task(rng: random.Random, progress: float) -> tuple[str, int]:
    """Task and long-context length for a batch, given training progress in [0, 1]."""
    if progress < WARMUP_FRACTION:
        return "copy", 0
    task = rng.choices(list(TASK_MIX), list(TASK_MIX.values()))[0]
    ramp = min(1.0, (progress - WARMUP_FRACTION) / 0.6)
    allowed = [L for L in LONGCTX_LENGTHS if L <= 128 + ramp * (LONGCTX_LENGTHS[-1] - 128)]
    return task, rng.choice(allowed)
