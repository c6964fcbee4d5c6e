"""Which waiting requests join the batch at an admission, and which of their prompts need a prefill.

Requests join in arrival order while the batch has slots (an echo-only request, max_tokens 0, needs none). A prompt
already cached or already taken in this admission is shared (an eval item's replicates); a new one is prefilled,
and costs its length from the admission's prefill budget (the engine's `prefill_tokens`), except the first, which
is always taken so that a prompt longer than the budget still runs.
"""

from __future__ import annotations

from qverify.serve.embedded.sequence import Prompt, Seq


def take_waiting(engine) -> tuple[dict[tuple[int, ...], Prompt], list[Seq]]:
    """The engine's first admission step (Engine._admit; `engine` untyped as in prefix_reads.take_hits: engine.py
    imports this module). Pops the waiting sequences that join now; returns (the new prompts to prefill, by ids;
    the sequences taken)."""
    fresh: dict[tuple[int, ...], Prompt] = {}
    admitted: list[Seq] = []
    budget, slots = engine.prefill_tokens, engine.max_batch - len(engine.running)
    while engine.waiting:
        s = engine.waiting[0]
        if s.req.max_tokens > 0 and slots <= 0:
            break
        key = tuple(s.req.prompt_ids)
        p = fresh.get(key) or engine.prompts.get(key)
        if p is None or (s.req.prompt_logprobs is not None and p.logp is None and key not in fresh):
            if fresh and len(key) > budget:
                break
            engine._serial += 1
            p = fresh[key] = Prompt(key, serial=engine._serial)
            budget -= len(key)
        else:
            engine.stats["shared_prefills"] += 1
        # every generation request reads its prompt as a radix hit (an echo never hits): prefix_reads.py
        s.hit = engine.reads_fp8_prefix and s.req.prompt_logprobs is None
        engine.waiting.popleft()
        s.prompt, p.users = p, p.users + 1
        slots -= s.req.max_tokens > 0
        admitted.append(s)
    return fresh, admitted
