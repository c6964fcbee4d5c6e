"""Accept length per suite as the embedded server serves it, and why it is what it is.

The measure is the engine's per-request `spec_accept_length` (SGLang's meta_info): tokens generated, the EOS
included, per target verify step, where a verify step checks the drafter's `spec_tokens` (4) proposals and emits
the accepted ones plus the target's own next token. The first token comes from the prefill and counts in the
numerator only, as in SGLang. So a perfect drafter reaches at most N / ceil((N - 1) / 5) on an N-token answer:
short answers cap it (`max_attainable`), and a per-token diagnostic (`drafter_top1`: how often the drafter's
greedy token equals the target's, on the target's own output) shows where a low figure comes from.
"""

from __future__ import annotations

import math

import torch

SPEC_TOKENS = 4  # the engine's default, as served


def _prompts(tok, suite, split: str, n: int) -> list[list[int]]:
    return [tok(tok.apply_chat_template(i.messages, tools=i.tools, tokenize=False, add_generation_prompt=True),
                add_special_tokens=False)["input_ids"] for i in suite.items(split, n)]


@torch.no_grad()
def _top1_agreement(draft, prompt: list[int], out: list[int]) -> float:
    logits = draft(torch.tensor([prompt + out])).logits[0, len(prompt) - 1: -1]
    return float((logits.argmax(-1) == torch.tensor(out)).float().mean())


@torch.no_grad()
def measure(target, draft, tok, n: int = 20, split: str = "test", temperature: float = 0.6) -> dict[str, dict]:
    """Per suite on `n` items of `split`: accept length greedy and at `temperature` (top-p 1, seeded), the share of
    items whose assisted greedy output equals plain greedy, the answers' length, the cap a perfect drafter would
    reach on them, and the drafter's top-1 agreement with the target's greedy output."""
    from qverify.reference.evaluate import suites_for
    from qverify.serve.embedded.engine import Engine, GenRequest

    target, draft = target.eval(), draft.eval()
    out: dict[str, dict] = {}
    for suite in suites_for(tok, lengths=(128, 256, 512, 1024)):  # the suite's served default lengths
        prompts, mt = _prompts(tok, suite, split, n), suite.sampling.max_tokens

        def run(drafter, temp, prompts=prompts, mt=mt):
            reqs = [GenRequest(p, mt, temperature=temp, seed=i) for i, p in enumerate(prompts)]
            return Engine(target, tok, drafter, max_batch=16, spec_tokens=SPEC_TOKENS).generate(reqs)

        spec, plain, sampled = run(draft, 0.0), run(None, 0.0), run(draft, temperature)
        gen = [r.n_generated for r in spec]

        def accept(rs) -> float:
            return round(sum(r.n_generated for r in rs) / sum(r.meta_info["spec_verify_ct"] for r in rs), 3)

        cap = sum(gen) / sum(max(1, math.ceil((g - 1) / (SPEC_TOKENS + 1))) for g in gen)
        eos = [[tok.eos_token_id] if r.finish_reason == "stop" else [] for r in plain]
        agree = [_top1_agreement(draft, p, r.token_ids + e) for p, r, e in zip(prompts, plain, eos)]
        out[suite.name] = {
            "accept_length": accept(spec), f"accept_length_t{temperature:g}": accept(sampled),
            "greedy_identical": sum(a.token_ids == b.token_ids for a, b in zip(spec, plain)) / len(prompts),
            "items": len(prompts), "answer_tokens_mean": round(sum(gen) / len(gen), 1),
            "max_attainable": round(cap, 2), "drafter_top1": round(sum(agree) / len(agree), 3)}
    return out
