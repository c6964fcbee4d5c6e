"""Drafting with a separate draft model (SGLang's STANDALONE): a small causal LM with its own latent cache.

The draft model runs in its own ModelRunner (slots moved with the target's). Before proposing, it catches up on the
tokens emitted since it last ran (`draft_pending`), then proposes greedily; the engine verifies (engine.py).
"""

from __future__ import annotations

import torch

from qverify.serve.embedded.runner import ModelRunner, PromptKV


def propose_standalone(run: list, d: ModelRunner, groups: list[tuple[PromptKV, torch.Tensor]], k: int) -> torch.Tensor:
    """The drafter's k greedy tokens per running sequence [B, k], after it catches up on what was emitted;
    `groups`: the running sequences by prompt, with the prompts' draft caches (engine._groups(True))."""
    n = max(len(s.draft_pending) for s in run)
    ids = torch.tensor([s.draft_pending + [s.draft_pending[-1]] * (n - len(s.draft_pending)) for s in run])
    dl = torch.tensor([s.draft_len for s in run])
    pos = torch.tensor([len(s.prompt.ids) + s.draft_len for s in run])[:, None] + torch.arange(n)[None]
    logits = d.decode(ids, pos, dl, groups)
    last = torch.tensor([len(s.draft_pending) - 1 for s in run])
    cur = logits[torch.arange(len(run)), last].argmax(-1)
    out = [cur]
    for s in run:
        s.draft_len += len(s.draft_pending)
    for _ in range(k - 1):
        dl = torch.tensor([s.draft_len for s in run])
        pos = torch.tensor([[len(s.prompt.ids) + s.draft_len] for s in run])
        cur = d.decode(cur[:, None], pos, dl, groups)[:, 0].argmax(-1)
        out.append(cur)
        for s in run:
            s.draft_len += 1
    return torch.stack(out, 1)
