"""A vectorized, batch-invariant seeded sampler: greedy, temperature and top-p for a whole batch at once.

Each row's randomness is counter-based noise, a hash of (seed, step, token id), turned into Gumbel noise; the
sampled token is argmax(logits / T + Gumbel) over the top-p nucleus (Gumbel-max draws exactly from the
renormalised nucleus). A request's draws therefore depend on its seed and position only, never on what else
shares the batch, and a speculative verify step samples position j with the same noise a plain decode step
would, so speculation never changes a seeded output. (torch.Generator per row would mean a Python loop per
step; torch has no counter-based random op on CPU, hence the hash, murmur3's finaliser on 32-bit lanes.)
"""

from __future__ import annotations

import torch

_M32 = 0xFFFFFFFF


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3 fmix32 on int64 lanes holding 32-bit values (products wrap; the low 32 bits stay exact)."""
    x = x ^ (x >> 16)
    x = (x * 0x85EBCA6B) & _M32
    x = x ^ (x >> 13)
    x = (x * 0xC2B2AE35) & _M32
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, steps: torch.Tensor, tokens: int | torch.Tensor) -> torch.Tensor:
    """Uniforms in (0, 1), a pure function of (seed, step, token id) per row: [R, vocab] for every token id when
    `tokens` is the vocabulary size, else [R, T] for the token ids in `tokens` [R, T] (the same values).

    The inputs are absorbed one at a time (h = mix(h ^ value + constant)), so no two inputs cancel each other.
    """
    tok = torch.arange(tokens, dtype=torch.int64)[None, :] if isinstance(tokens, int) else tokens.long()
    h = _mix32((seeds[:, None] & _M32) ^ 0x243F6A88)
    h = _mix32(h ^ (((seeds[:, None] >> 32) + 0x85A308D3) & _M32))
    h = _mix32(h ^ ((steps[:, None] * 0x9E3779B1 + 0x13198A2E) & _M32))
    hi = _mix32(_mix32(h ^ tok) ^ 0x03707344)
    lo = _mix32(_mix32(hi ^ tok) ^ 0xA4093822)
    return ((hi << 21 | lo >> 11).double() + 0.5) / float(1 << 53)


def _gumbel(u: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(u))


def _gumbel_argmax(z: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor, tokens: torch.Tensor | None) -> torch.Tensor:
    """argmax over columns of z + Gumbel noise per row (tokens [R, K]: the columns' token ids; None: column k is
    token k). The engine's kernel computes the same hash per element in one pass (the torch form below is ~50 ops
    over [R, K] int64 tensors, most of the sampler's time); torch when the kernel is not built."""
    from qverify.serve.embedded.mqa_kernel import load

    ext = load()
    if ext is not None and z.dtype == torch.float32:
        return ext.gumbel_argmax(z, seeds, steps, torch.empty(0, dtype=torch.long) if tokens is None else tokens)
    g = _gumbel(uniform_noise(seeds, steps, z.shape[-1] if tokens is None else tokens))
    return (z.double() + g).argmax(-1)


def sample(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, seeds: torch.Tensor,
           steps: torch.Tensor, banned: torch.Tensor | None = None) -> torch.Tensor:
    """Token ids [R] for logits [R, V]; temperature <= 0 means greedy. `banned` [R, V] bool masks tokens out."""
    x = logits.float()
    if banned is not None:
        x = x.masked_fill(banned, float("-inf"))
    greedy = temperature <= 0
    out = x.argmax(-1)
    if bool(greedy.all()):
        return out
    rows = (~greedy).nonzero().squeeze(1)
    z = x[rows] / temperature[rows, None]
    p = top_p[rows]
    nucleus = p < 1
    if bool(nucleus.any()):
        i = nucleus.nonzero().squeeze(1)
        out[rows[i]] = _top_p_tokens(z[i], p[i], seeds[rows[i]], steps[rows[i]])
    whole = (~nucleus).nonzero().squeeze(1)  # top_p 1: the whole vocabulary
    if len(whole):
        r = rows[whole]
        out[r] = _gumbel_argmax(z[whole], seeds[r], steps[r], None)
    return out


def _top_p_tokens(z: torch.Tensor, p: torch.Tensor, seeds: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Gumbel-max over each row's nucleus (the smallest prefix of its tokens by probability whose mass reaches
    p), for rows with p < 1. Ranking the whole vocabulary is the cost (topk runs ~2 us per row per call even for
    k = 8), and the nucleus is usually small (main-job suites at T 0.6, top_p 0.95: under 8 tokens in 98% of
    rows), so rows are ranked in widening stages, top 8, then top 64, then all, each stage taking the rows whose
    nucleus it holds. A row's token is the same whichever stage takes it: the same prefix sums, and noise that is a
    function of the token id (uniform_noise)."""
    V = z.shape[-1]
    probs = torch.softmax(z, -1)
    out = torch.empty(z.shape[0], dtype=torch.long)
    todo = torch.arange(z.shape[0])
    for k in (8, 64, V):
        if k >= V:
            sp, si = probs[todo].sort(-1, descending=True)
        else:
            sp, si = probs[todo].topk(k, -1)
        cum = sp.cumsum(-1)
        fits = torch.ones_like(todo, dtype=torch.bool) if k >= V else cum[:, -1] >= p[todo]  # next token not kept
        r, sp, si, cum = todo[fits], sp[fits], si[fits], cum[fits]
        keep = (cum - sp) < p[r, None]
        zs = z[r].gather(1, si).masked_fill(~keep, float("-inf"))
        out[r] = si.gather(1, _gumbel_argmax(zs, seeds[r], steps[r], si)[:, None])[:, 0]
        todo = todo[~fits]
        if not len(todo):
            break
    return out


def batch_params(rows: list[tuple[float, float, int, list[int]]], vocab: int):
    """sample()'s per-row arguments from (temperature, top_p, seed, banned token ids) per row: temperature, top_p,
    seeds, banned (None when no row bans anything; else one scatter for the whole batch, not one per row)."""
    banned = None
    if any(r[3] for r in rows):
        banned = torch.zeros(len(rows), vocab, dtype=torch.bool)
        at = [(i, t) for i, r in enumerate(rows) for t in r[3]]
        banned[torch.tensor([i for i, _ in at]), torch.tensor([t for _, t in at])] = True
    return (torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows]),
            torch.tensor([r[2] for r in rows], dtype=torch.long), banned)


def logprob_rows(logits: torch.Tensor, chosen: torch.Tensor, k: int) -> tuple[list[float], list[list[tuple[int, float]]]]:
    """Logprobs of the chosen tokens under the model's distribution, and the top-k per row."""
    logp = torch.log_softmax(logits.float(), -1)
    chosen_lp = logp.gather(1, chosen[:, None])[:, 0].tolist()
    if k <= 0:
        return chosen_lp, [[] for _ in chosen_lp]
    v, i = logp.topk(k, -1)
    return chosen_lp, [list(zip(ii, vv)) for ii, vv in zip(i.tolist(), v.tolist())]
