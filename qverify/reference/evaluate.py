"""Greedy evaluation on the validation or test split with the suites' own scorers, straight on a model (no server).

Used for the training curve and the model card; `qverify eval` is the served path.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict

import torch

from qverify.chatfmt import parse_tool_calls
from qverify.models import Response, ToolCall
from qverify.suites.coding import CodingSuite, extract_code
from qverify.suites.longctx import LongContextSuite
from qverify.suites.toolcall import ToolCallSuite


def _run_code(program: str) -> bool:
    """Training-time check of our own tiny model's code. The served path uses the bwrap sandbox."""
    try:
        from qverify.suites.sandbox import run_tests

        return run_tests(program).passed
    except ImportError:
        try:
            return subprocess.run([sys.executable, "-c", program], capture_output=True, timeout=5,
                                  check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False


@torch.no_grad()
def generate(model, tok, prompts: list[str], max_new_tokens: int, batch: int = 8) -> list[tuple[str, str]]:
    """Greedy; returns (text with special tokens, finish_reason)."""
    tok.padding_side = "left"
    out = []
    eos = tok.convert_tokens_to_ids(tok.eos_token)
    for i in range(0, len(prompts), batch):
        enc = tok(prompts[i: i + batch], return_tensors="pt", padding=True, add_special_tokens=False)
        gen = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos,
                             pad_token_id=tok.pad_token_id)
        for row in gen[:, enc["input_ids"].shape[1]:]:
            ids = row.tolist()
            finish = "stop" if eos in ids else "length"
            ids = ids[: ids.index(eos)] if eos in ids else ids
            ids = [t for t in ids if t != tok.pad_token_id]
            out.append((tok.decode(ids, skip_special_tokens=False), finish))
    return out


def to_response(text: str, finish: str) -> Response:
    parsed = parse_tool_calls(text)
    calls = [ToolCall(id=c["id"], name=c["name"], arguments=c["arguments"]) for c in parsed.tool_calls]
    return Response(content=parsed.content, tool_calls=calls, finish_reason="tool_calls" if calls else finish)


def suites_for(tok, lengths=(128, 256, 512, 768, 1024)) -> list:
    count = lambda s: len(tok(s, add_special_tokens=False)["input_ids"])
    return [CodingSuite(), ToolCallSuite(), LongContextSuite(count_tokens=count, lengths=lengths)]


def evaluate(model, tok, n: int = 50, lengths=(128, 256, 512, 768, 1024), split: str = "validation") -> dict[str, float]:
    """Greedy scores per suite on `split`: validation while training (the curve), test for the card."""
    scores: dict[str, float] = {}
    for suite in suites_for(tok, lengths):
        items = suite.items(split, n)
        prompts = [tok.apply_chat_template(i.messages, tools=i.tools, tokenize=False, add_generation_prompt=True) for i in items]
        gens = generate(model, tok, prompts, suite.sampling.max_tokens, batch=4 if suite.name == "longctx" else 8)
        agg: dict[str, list[float]] = defaultdict(list)
        for item, (text, fin) in zip(items, gens):
            resp = to_response(text, fin)
            if suite.name == "coding":
                ok = _run_code(extract_code(resp.content or "") + "\n\n" + item.target["tests"])
                values = {"pass@1": float(ok), f"pass@1/level{item.metadata['level']}": float(ok)}
            else:
                values = suite.score(item, resp).values
            for k, v in values.items():
                agg[k].append(v)
        for k, v in agg.items():
            if k == suite.primary_metric or k.startswith(("accuracy@", "pass@1/level")) or k == "trigger":
                scores[f"{suite.name}/{k}"] = round(sum(v) / len(v), 3)
    return scores
