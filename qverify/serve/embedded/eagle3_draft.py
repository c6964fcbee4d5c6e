"""EAGLE3 drafting in the embedded engine: which rows the head caches, what it proposes, what it learns after a verify.

The schedule is SGLang 0.5.23's EAGLE worker (speculative/eagle_worker_v2.py) with top-k 1:
- the head's row at position j reads token j + 1 and the target's hidden states at position j, and predicts token
  j + 2. After a prompt's prefill the head runs over the prompt shifted by one (`_draft_extend_for_prefill`: input
  ids `prompt[1:] + [first token]`, the target's captured states at positions 0..P-1);
- a step: the head first catches up on the tokens the last verify accepted, with the target's states at the
  positions before them (`_draft_extend_for_decode`); those rows are kept. Its last row gives the first draft; each
  further draft reads the previous draft and the head's own output state (`draft_forward`); those rows are
  provisional: the next catch-up overwrites them.
- draft ids are in the draft vocabulary, mapped to target ids through `d2t` (`hot_token_id`).
The target's verify is the engine's (engine.py); acceptance, and so the output, never depends on the drafter.

Simple rather than fast: each sequence keeps its own rows (the prompt's rows, shared, plus its own), and attention
runs per sequence; every per-token layer (fc, norms, projections, MLP, lm_head) runs batched over all of them.
What is not emulated: an FP8 KV cache for the head's own rows (SGLang gives the draft the server's
--kv-cache-dtype); the head's rows stay in the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from qverify.serve.embedded.eagle3_head import Eagle3Head, is_eagle3_head

__all__ = ["Eagle3Drafter", "PromptRows", "SeqDraft", "is_eagle3_head"]
from qverify.serve.embedded.mla import MLALayer, rope_tables


@dataclass
class PromptRows:
    rows: torch.Tensor  # [P - 1, width]: the head's rows for positions 0..P-2 (tokens 1..P-1)
    last_hidden: torch.Tensor  # the target's captured states at position P - 1 (paired with the first token)


@dataclass
class SeqDraft:
    prompt: PromptRows
    own: torch.Tensor  # [cap, width]: the rows from position P - 1 on
    kept: int = 0  # rows of `own` that are kept (the rest are a step's provisional drafts)
    pending: list[int] = field(default_factory=list)  # accepted tokens the head has not read yet
    pending_hidden: torch.Tensor | None = None  # the target's states at the positions before them


class Eagle3Drafter:
    def __init__(self, head: Eagle3Head):
        self.head = head
        self.layer = head.layers[0]
        self.capture = head.capture
        a = self.layer.self_attn
        if head.mla:
            self.mla = MLALayer(a, head.config)
            self.width = self.mla.width
            self._rope: dict = {}
        else:
            self.kv = a.k_proj.out_features
            self.width = 2 * self.kv

    # ---- the engine's hooks ----
    def prompt_rows(self, ids: tuple[int, ...], hidden: torch.Tensor) -> PromptRows:
        """After the target's prefill of a prompt; `hidden` [P, aux width] its captured states."""
        empty = torch.empty(0, self.width)
        if len(ids) == 1:
            return PromptRows(empty, hidden[-1])
        seq = SeqDraft(PromptRows(empty, hidden[-1]), torch.empty(len(ids) - 1, self.width))
        self._forward([seq], torch.tensor(ids[1:]), hidden[:-1], [len(ids) - 1])
        return PromptRows(seq.own[: len(ids) - 1].clone(), hidden[-1])

    def start(self, prompt: PromptRows, first_token: int) -> SeqDraft:
        return SeqDraft(prompt, torch.empty(16, self.width), pending=[first_token],
                        pending_hidden=prompt.last_hidden[None])

    def accepted(self, s: SeqDraft, tokens: list[int], hidden: torch.Tensor) -> None:
        """After a verify: the emitted tokens, and the target's states at the positions before each."""
        s.pending, s.pending_hidden = list(tokens), hidden[: len(tokens)]

    @torch.no_grad()
    def propose(self, seqs: list[SeqDraft], k: int) -> torch.Tensor:
        """k draft tokens (target ids) per sequence: [B, k]."""
        counts = [len(s.pending) for s in seqs]
        ids = torch.tensor([t for s in seqs for t in s.pending])
        logits, out = self._forward(seqs, ids, torch.cat([s.pending_hidden for s in seqs]), counts)
        last = torch.tensor(counts).cumsum(0) - 1
        for s, n in zip(seqs, counts):
            s.kept += n
            s.pending, s.pending_hidden = [], None
        cur, hidden = logits[last].argmax(-1), out[last]
        drafts = [self.head.to_target_ids(cur)]
        for i in range(k - 1):  # provisional rows after the kept ones
            logits, hidden = self._forward(seqs, drafts[-1], hidden, [1] * len(seqs), provisional=i)
            drafts.append(self.head.to_target_ids(logits.argmax(-1)))
        return torch.stack(drafts, 1)

    # ---- the head's forward ----
    @torch.no_grad()
    def _forward(self, seqs: list[SeqDraft], ids: torch.Tensor, hidden: torch.Tensor, counts: list[int],
                 provisional: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """New rows for each sequence (counts[b] of them, after its kept rows plus `provisional` earlier drafts);
        returns the draft logits and the states the next draft step reads, one per new token."""
        head, layer = self.head, self.layer
        starts = [len(s.prompt.rows) + s.kept + provisional for s in seqs]
        pos = torch.cat([torch.arange(st, st + n) for st, n in zip(starts, counts)])
        x = head.into_width(hidden.to(head.fc.weight.dtype))
        residual = x
        h = torch.cat([layer.input_layernorm(head.embed(ids)), layer.hidden_norm(x)], -1)
        q, rows = self._project(h, pos)
        outs, at = [], 0
        for s, n in zip(seqs, counts):
            own_at = s.kept + provisional
            if own_at + n > s.own.shape[0]:  # grow (doubling) the sequence's rows
                grown = torch.empty(max(2 * s.own.shape[0], own_at + n), self.width)
                grown[:own_at] = s.own[:own_at]
                s.own = grown
            s.own[own_at: own_at + n] = rows[at: at + n]
            outs.append(self._attend(q[at: at + n], torch.cat([s.prompt.rows, s.own[: own_at + n]])))
            at += n
        residual = residual + layer.self_attn.o_proj(torch.cat(outs))
        residual = residual + layer.mlp(layer.post_attention_layernorm(residual))
        normed = head.norm(residual)
        return head.logits(normed), (normed if head.norm_output else residual)

    def _project(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries and the rows to cache for new tokens: the MLA head's latent rows (mla.py, the target's code),
        or a Llama head's roped keys and values."""
        layer = self.layer
        if self.head.mla:
            cos, sin = rope_tables(layer.rotary_emb, pos, h[None], self._rope)
            p = self.mla.project(h[None], cos, sin)
            return self.mla.absorbed_query(p), p.cached
        from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

        a, n = layer.self_attn, h.shape[0]
        q = a.q_proj(h).view(n, -1, a.head_dim).transpose(0, 1)[None]
        k = a.k_proj(h).view(n, -1, a.head_dim).transpose(0, 1)[None]
        cos, sin = layer.rotary_emb(h[None], pos[None])
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q[0].transpose(0, 1), torch.cat([k[0].transpose(0, 1).reshape(n, -1), a.v_proj(h)], -1)

    def _attend(self, q: torch.Tensor, ctx: torch.Tensor) -> torch.Tensor:
        """Causal attention of the last n = len(q) positions of `ctx` [L, width] over it: [n, heads * dv]."""
        n, L = q.shape[0], ctx.shape[0]
        future = torch.arange(L)[None, :] > torch.arange(L - n, L)[:, None]  # [n, L]
        if self.head.mla:  # absorbed MQA over the latent rows (softmax scale folded into q by MLALayer)
            scores = torch.einsum("nhw,lw->hnl", q, ctx).masked_fill(future, float("-inf"))
            o_lat = torch.einsum("hnl,lc->nhc", torch.softmax(scores, -1), ctx[:, : self.mla.C])
            return self.mla.output(o_lat)
        a = self.layer.self_attn
        k = ctx[:, : self.kv].view(L, -1, a.head_dim).repeat_interleave(a.num_key_value_groups, 1)
        v = ctx[:, self.kv:].view(L, -1, a.head_dim).repeat_interleave(a.num_key_value_groups, 1)
        scores = (torch.einsum("nhd,lhd->hnl", q, k) * a.scaling).masked_fill(future, float("-inf"))
        return torch.einsum("hnl,lhd->nhd", torch.softmax(scores, -1), v).reshape(n, -1)
