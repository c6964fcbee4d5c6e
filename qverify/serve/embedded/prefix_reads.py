"""Which of a prompt's rows SGLang 0.5.23 reads back from its FP8 KV pool while it prefills, and how many.

SGLang prefills a fresh prompt over its unrounded latent (mla.MLALayer.prefill), but a prefill that starts from a
cached prefix reads that prefix back from the pool: every `extend` with a prefix runs MHA_CHUNKED_KV on trtllm_mla
(srt/models/deepseek_common/attention_backend_handler.py:170-179), which gathers the prefix's latent from the pool,
dequantizes it and re-expands it with kv_b_proj (attention_forward_methods/forward_mha.py:520-563, 628-649);
flashinfer reads the pool `.to(q.dtype)` (layers/attention/flashinfer_mla_backend.py:761) or, from 8,192 prefix
tokens, re-reads every row through MHA_ONE_SHOT (forward_mha.py:254-287). Two things give a prefill a prefix:
- a radix-cache hit: a request whose prompt an earlier request already prefilled (an eval item's replicates);
- chunked prefill: a prompt longer than `chunked_prefill_size` is prefilled in chunks, each over the ones before.
Pages, limits and defaults below are SGLang's; mla.py and runner.py compute the numerics.

When a replicate hits: SGLang's default `fcfs` policy does not share a prefill between requests scheduled in the
same batch (managers/schedule_policy.py:231-235: no in-batch prefix matching), so a replicate that lands in the
first one's prefill batch computes fresh and one scheduled after it hits; which happens depends on timing, and the
first request of a prompt hits only when an earlier one (a previous turn, a shared system prompt) left its prefix.
The engine reads every generation request's prompt as a hit, the first included: the warm-cache steady state of a
serving node (agent sessions extend cached turns), the same for every request whatever its arrival order or batch
(so paired runs of two builds stay paired: a first-arrival rule would give replicate r the fresh path in one session
and the cached one in another), and on flashinfer the side with more FP8 KV loss (figures: docs/serve.md).
A request asking for prompt logprobs (the kld suite's echo) never hits: SGLang sets its logprob_start_len to 0
(entrypoints/openai/serving_completions.py:88-92), which caps the match at 0 tokens (managers/schedule_batch.py:
1774-1775).
"""

from __future__ import annotations

import torch

from qverify.serve.embedded.sequence import Prompt

# SGLang's page size per MLA backend: trtllm_mla and cutedsl_mla force 64 when unset (arg_groups/overrides.py:
# 1155-1173); flashinfer keeps the default page of 1 token
PAGE_SIZE: dict[str, int] = {"trtllm_mla": 64, "cutedsl_mla": 64, "flashinfer": 1}

# SGLang's chunked_prefill_size on a GPU of >= 160 GiB (B200), the production target (arg_groups/memory_hook.py:167);
# an H200 gets 8,192 (memory_hook.py:146-153)
CHUNKED_PREFILL_SIZE = 16384


def cached_prefix_len(prompt_len: int, backend: str, eagle: bool = False) -> int:
    """Tokens of a cached prompt that a radix hit serves from the pool: at most all but the last token (its logits
    are computed: managers/schedule_batch.py:1766-1768), page-aligned (mem_cache/radix_cache.py:147-151); under
    EAGLE the tree is keyed by bigrams, one fewer than tokens (radix_cache.py:96-100, 153-164)."""
    page = PAGE_SIZE[backend]
    limit = prompt_len - 1 - (1 if eagle else 0)
    return max(0, limit // page * page)


def chunk_starts(prompt_len: int, chunk: int | None) -> list[int]:
    """Where each prefill chunk of a prompt starts ([0] when it fits in one): SGLang splits at chunked_prefill_size
    tokens (a multiple of every page size above, so its page alignment of a chunk changes nothing)."""
    if not chunk or prompt_len <= chunk:
        return [0]
    return list(range(0, prompt_len, chunk))


def take_hits(engine, admitted: list) -> list:
    """The engine's admission step for radix hits (Engine._admit). Each generation request reads its prompt through
    the prompt's radix-hit view, computed once per prompt: the cached prefix read back from the pool, the rest
    prefilled over it. Returns the sequences that go on (one whose view fails is answered with the error)."""
    out = []
    for s in admitted:
        failed = _read_hit(engine, s.prompt) if s.hit and s.prompt.hit is None else None
        if failed is not None:
            s.done(None, failed)
            s.prompt.users -= 1
            continue
        if s.hit:
            s.prompt = s.prompt.hit
        out.append(s)
    return out


def _read_hit(engine, p: Prompt) -> Exception | None:
    """Sets p.hit, the prompt as a radix hit reads it; returns what that prefill raised, if it did."""
    m = cached_prefix_len(len(p.ids), engine.backend, engine.eagle is not None)
    if m == 0:
        p.hit = p  # nothing a page long to hit: prefilled fresh
        return None
    try:
        kv, logits = engine.runner.extend(p.kv, m, list(p.ids[m:]), torch.tensor([len(p.ids) - m - 1]))
    except Exception as e:  # noqa: BLE001 - this prompt's own failure, as in _prefill_each_alone_on_error
        return e
    engine._serial += 1
    # the drafter's rows stay the first request's: drafts change how many tokens a step accepts, not which
    p.hit = Prompt(p.ids, kv, p.draft_kv, p.eagle, logits[0], serial=engine._serial, base=p)
    engine.stats["prefix_hits"] += 1
    return None
