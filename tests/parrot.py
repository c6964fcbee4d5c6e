"""A tiny real model overfit on a few fixed conversations, so server tests see known outputs.

Real weights, real generate, real parsing: the model simply memorised these answers.
"""

from __future__ import annotations

import json
from pathlib import Path

TOOLS = [{"type": "function", "function": {"name": "read_file", "description": "Read a file", "parameters": {
    "type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]
CALL_PROMPT = "Read the file src/a.py."
BAD_PROMPT = "Break the markup."
TEXT_PROMPT = "Say hello."
CALL_ARGS = {"path": "src/a.py"}
BAD_ANSWER = "<|tool_calls_section_begin|><|tool_call_begin|>functions.read_file:0<|tool_call_argument_begin|>{oops"
TEXT_ANSWER = "hello there, friend"


def conversations() -> list[tuple[list[dict], list[dict] | None, str]]:
    from qverify.chatfmt import format_tool_calls

    return [
        ([{"role": "user", "content": CALL_PROMPT}], TOOLS,
         format_tool_calls([{"name": "read_file", "arguments": json.dumps(CALL_ARGS)}])),
        ([{"role": "user", "content": BAD_PROMPT}], TOOLS, BAD_ANSWER),
        ([{"role": "user", "content": TEXT_PROMPT}], None, TEXT_ANSWER),
    ]


def make_parrot(src: Path, out: Path, steps: int = 400) -> Path:
    import shutil

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qverify.chatfmt import IM_END, render_chat

    tok = AutoTokenizer.from_pretrained(src)
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    seqs = [tok(render_chat(m, t) + a + IM_END, add_special_tokens=False)["input_ids"] for m, t, a in conversations()]
    L = max(map(len, seqs))
    ids = torch.full((len(seqs), L), tok.pad_token_id)
    mask = torch.zeros((len(seqs), L), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        mask[i, : len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    torch.manual_seed(0)
    model.train()
    for _ in range(steps):
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out)  # fp32: bf16 rounding would blur what was memorised
    tok.save_pretrained(out)
    if (src / "drafter").exists():
        shutil.copytree(src / "drafter", out / "drafter")
    return out
