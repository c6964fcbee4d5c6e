"""The drafter: distilled on the target's own greedy outputs (sequence-level KD), and its acceptance.

Why the induction share: the first distilled drafter (0.89M tokens on the target's outputs only) predicted the
answers' format but copied nothing: on long-context answers (`KEY_NAME = 1497`) it missed every key and value
token, even a line the answer had just written, and its accept length was 1.66 there. A sequence of random token
ids repeated once can only be predicted by copying (data.induction_batch), so a share of those batches, and a
distillation pool weighted to long context at every length the suite uses, teach it what the target does there.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from qverify.reference import data
from qverify.reference.train import TrainConfig, train

# distillation pool: task -> (share of prompts, max new tokens); long context at every served length
POOL_MIX = {"longctx": (0.5, 48), "coding": (0.25, 160), "toolcall": (0.25, 160)}
# batches: pure induction first (forms the copy circuit), then mostly the pool
INDUCTION_FIRST = 0.3
DRAFT_MIX = {"distill": 0.8, "induction": 0.15, "copy": 0.05}


def engine_greedy(target, tok, prompts: list[str], max_new_tokens: int) -> list[str]:
    """The target's greedy answers, by the embedded engine (continuous batching: ~20x transformers' generate here)."""
    from qverify.serve.embedded.engine import Engine, GenRequest

    reqs = [GenRequest(tok(p, add_special_tokens=False)["input_ids"], max_new_tokens) for p in prompts]
    return [r.text for r in Engine(target.eval(), tok, max_batch=16).generate(reqs)]


def target_outputs(target, tok, work: Path, n_prompts: int) -> list[data.Example]:
    path = work / "distill.jsonl"
    if path.exists():
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        if len(rows) >= n_prompts:
            return [data.Example(r["prompt"], r["answer"]) for r in rows]
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
    rows = []
    for task, (share, max_new) in POOL_MIX.items():
        exs: list[data.Example] = []
        for s in range(max(1, round(n_prompts * share / 8))):
            length = data.LONGCTX_LENGTHS[s % len(data.LONGCTX_LENGTHS)]
            exs += data.examples(task, 8, 10_000 + s, count, length)
        outs = engine_greedy(target, tok, [e.prompt for e in exs], max_new)
        rows += [{"task": task, "prompt": e.prompt, "answer": text} for e, text in zip(exs, outs)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return [data.Example(r["prompt"], r["answer"]) for r in rows]


def _bucket(n_tokens: int) -> int:
    """A pool example's batch bucket: its length rounded up to a multiple of 128 tokens (little padding)."""
    return 128 * -(-n_tokens // 128)


def distill(draft, target, tok, cfg: TrainConfig, work: Path, n_prompts: int) -> dict:
    pool = target_outputs(target, tok, work, n_prompts)
    buckets: dict[int, list[data.Example]] = {}
    for e in pool:
        buckets.setdefault(_bucket(len(tok(e.prompt + e.answer, add_special_tokens=False)["input_ids"]) + 1), []).append(e)
    sizes = sorted(buckets)

    def task_fn(rng: random.Random, progress: float) -> tuple[str, int]:
        """Induction first, then the mix; a distill batch is one length bucket, drawn in proportion to its examples."""
        task = "induction" if progress < INDUCTION_FIRST else rng.choices(list(DRAFT_MIX), list(DRAFT_MIX.values()))[0]
        if task != "distill":
            return task, 0
        return task, rng.choices(sizes, [len(buckets[b]) for b in sizes])[0] - 20  # train sizes batches by length + 20

    def example_fn(task, bsz, seed, count, length):
        if task != "distill":
            return data.examples(task, bsz, seed, count, length)
        rng = random.Random(seed)
        return [rng.choice(buckets[length + 20]) for _ in range(bsz)]

    return train(draft, tok, cfg, work, task_fn=task_fn, example_fn=example_fn, tag="drafter")


@torch.no_grad()
def acceptance(target, draft, tok, n: int = 20, split: str = "test") -> dict[str, dict]:
    """Per suite, as the embedded engine serves it (qverify.reference.spec_accept)."""
    from qverify.reference.spec_accept import measure

    return measure(target, draft, tok, n=n, split=split)
