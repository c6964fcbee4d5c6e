"""The drafter: distilled on the target's own greedy outputs (sequence-level KD), and its acceptance."""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from qverify.reference import data
from qverify.reference.evaluate import generate
from qverify.reference.train import TrainConfig, train


def target_outputs(target, tok, work: Path, n_prompts: int) -> list[data.Example]:
    path = work / "distill.jsonl"
    if path.exists():
        rows = [json.loads(x) for x in path.read_text().splitlines()]
        if len(rows) >= n_prompts:
            return [data.Example(r["prompt"], r["answer"]) for r in rows]
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    exs: list[data.Example] = []
    for s in range(n_prompts // 8):
        task = ["coding", "toolcall", "longctx", "coding", "toolcall"][s % 5]
        exs += data.examples(task, 8, 10_000 + s, count, random.Random(s).choice([128, 256, 512]))
    outs = generate(target, tok, [e.prompt for e in exs], 160, batch=8)
    rows = [{"prompt": e.prompt, "answer": text} for e, (text, _f) in zip(exs, outs)]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    return [data.Example(r["prompt"], r["answer"]) for r in rows]


def distill(draft, target, tok, cfg: TrainConfig, work: Path, n_prompts: int) -> dict:
    pool = target_outputs(target, tok, work, n_prompts)

    def task_fn(rng, progress):
        return "distill", 0

    def example_fn(task, bsz, seed, count, length):
        rng = random.Random(seed)
        return [rng.choice(pool) for _ in range(bsz)]

    return train(draft, tok, cfg, work, task_fn=task_fn, example_fn=example_fn, tag="drafter")


@torch.no_grad()
def acceptance(target, draft, tok, n: int = 20, split: str = "test") -> dict[str, dict]:
    """Per suite: target tokens per target forward pass under assisted greedy decoding, and
    whether the assisted output is identical to plain greedy, on `n` items of `split`."""
    from qverify.reference.evaluate import suites_for

    forwards = {"n": 0, "counting": False}

    def count(*_):
        forwards["n"] += forwards["counting"]

    hook = target.register_forward_hook(count)
    eos = tok.eos_token_id
    out: dict[str, dict] = {}
    try:
        for suite in suites_for(tok):
            produced, identical, forwards["n"] = 0, 0, 0
            items = suite.items(split, n)
            for item in items:
                prompt = tok.apply_chat_template(item.messages, tools=item.tools, tokenize=False, add_generation_prompt=True)
                enc = tok(prompt, return_tensors="pt", add_special_tokens=False)
                gen = dict(max_new_tokens=suite.sampling.max_tokens, do_sample=False, eos_token_id=eos,
                           pad_token_id=tok.pad_token_id)
                forwards["counting"] = True  # only the assisted run's target forwards count
                assisted = target.generate(**enc, assistant_model=draft, **gen)
                forwards["counting"] = False
                produced += assisted.shape[1] - enc["input_ids"].shape[1]
                identical += int(torch.equal(assisted, target.generate(**enc, **gen)))
            out[suite.name] = {"accept_length": round(produced / max(forwards["n"], 1), 3), "items": len(items),
                               "greedy_identical": identical / len(items)}
    finally:
        hook.remove()
    return out
