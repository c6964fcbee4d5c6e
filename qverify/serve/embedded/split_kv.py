"""Decode attention over the latent without qverify's kernel (mqa_kernel.fused_decode): the split-KV form.

Each sequence's context is split in two: its prompt, stored once per distinct prompt and shared by every sequence
that has it (an item's replicates), and its own generated rows. The prompt part is one GEMM per prompt for all its
sequences' queries stacked (the replicates read the shared rows once), or one batched GEMM over a padded table of
similar-length prompts; the generated part is one batched GEMM over all sequences; the two are merged with their
log-sum-exp, as split-KV kernels do. The engine runs this when the kernel cannot be built (no compiler, no AVX2,
QVERIFY_MQA_KERNEL=0); the greedy-equals-HF tests run it too.
"""

from __future__ import annotations

import torch

from qverify.serve.embedded.mqa_kernel import attention_pieces, length_mask
from qverify.serve.embedded.mqa_kernel import ready as kernel_ready


def _partial(s: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Softmax pieces of one KV split: (row max, row sum of exp, unnormalised output)."""
    m = s.amax(-1, keepdim=True)
    e = torch.exp(s - m)
    return m, e.sum(-1, keepdim=True), torch.matmul(e, values)


FLASH_MIN_ROWS = 32  # latent rows from which torch's fused kernel beats two GEMMs (A/B in decode steps, 60 sequences)


def _pieces(q: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor | None, C: int):
    """Softmax pieces of q [N, R, W] against rows [N, L, W]: (max or log-sum-exp, row sum or None (1),
    output), query row r of sequence n seeing the first lens[n, r] rows (lens [N, R or 1], None: all).

    A fused kernel (mqa_kernel.py: qverify's, else torch's flash kernel) reads each latent row once for scores and
    values (the two-GEMM form reads it twice, and at 4 query rows per latent row the GEMMs are bound by those
    reads); below FLASH_MIN_ROWS rows torch's kernel loses to the two GEMMs, qverify's does not."""
    if kernel_ready() or rows.shape[1] >= FLASH_MIN_ROWS:
        lse, o = attention_pieces(q, rows, lens, C)
        return lse, None, o
    s = torch.matmul(q, rows.transpose(-1, -2))
    if lens is not None:
        s = s + length_mask(lens, rows.shape[1])
    return _partial(s, rows[..., :C])


class PromptTable:
    """Live prompts' rows in one padded, persistent buffer [layers, slots, P, width], so a decode step reads every
    prompt with one batched GEMM. A prompt's rows are copied in once, when it first decodes; its slot is freed
    (and reused, lowest first) when no running sequence has it."""

    def __init__(self, layers: int, width: int):
        self.rows = torch.zeros(layers, 8, 64, width)
        self.lens = torch.zeros(8, dtype=torch.long)
        self.slot: dict[int, int] = {}  # id(PromptKV) -> slot

    def sync(self, kvs: list) -> list[int]:
        """Make the table hold exactly `kvs` (the live prompts); returns their slots."""
        live = {id(kv) for kv in kvs}
        for k in [k for k in self.slot if k not in live]:
            self.lens[self.slot.pop(k)] = 0
        for kv in kvs:
            if id(kv) in self.slot:
                continue
            used = set(self.slot.values())
            s = next((i for i in range(self.rows.shape[1]) if i not in used), None)
            if s is None:
                s = self._grow_slots()
            n = kv.rows.shape[1]
            if n > self.rows.shape[2]:
                self._grow_len(n)
            self.rows[:, s, :n] = kv.rows
            self.lens[s], self.slot[id(kv)] = n, s
        return [self.slot[id(kv)] for kv in kvs]

    def _grow_slots(self) -> int:
        old = self.rows.shape[1]
        self.rows = torch.cat([self.rows, torch.zeros_like(self.rows)], 1)
        self.lens = torch.cat([self.lens, torch.zeros_like(self.lens)])
        return old

    def _grow_len(self, n: int) -> None:
        cap = self.rows.shape[2]
        while cap < n:
            cap *= 2
        new = torch.zeros(self.rows.shape[0], self.rows.shape[1], cap, self.rows.shape[3])
        new[:, :, : self.rows.shape[2]] = self.rows
        self.rows = new


class PromptPlan:
    """How one decode step reads the prompts' rows, computed once per step for all layers.

    Similar-length prompts (short contexts): one batched GEMM over the persistent PromptTable. Mixed lengths (long
    contexts): one GEMM per prompt, where padding would waste more than the loop costs.
    """

    def __init__(self, groups: list[tuple[object, torch.Tensor]], B: int, table: PromptTable):
        self.groups = groups
        lens = [kv.rows.shape[1] for kv, _ in groups]
        G, P = len(groups), max(lens)
        self.batched = G > 1 and G * P <= 1.5 * sum(lens)  # (a padded table costs copies: measured worse at 3x)
        if not self.batched:
            self.order = torch.cat([idx for _, idx in groups])
            self.inv = torch.empty_like(self.order)
            self.inv[self.order] = torch.arange(B)
            self.identity = torch.equal(self.order, torch.arange(B))
            return
        slots = table.sync([kv for kv, _ in groups])
        S = max(slots) + 1
        if S * P > 2 * sum(lens):  # freed slots left holes: compact by starting over
            table.slot.clear()
            table.lens.zero_()
            slots = table.sync([kv for kv, _ in groups])
            S = max(slots) + 1
        self.table = table.rows[:, :S, :P]
        self.lens = table.lens[:S, None].clone()  # [S, 1]: a free slot has 0 rows
        self.k = max(len(idx) for _, idx in groups)
        gather = torch.zeros(S, self.k, dtype=torch.long)  # empty member slots point at sequence 0, never read back
        self.seq_pos = torch.empty(B, dtype=torch.long)
        for s, (_, idx) in zip(slots, groups):
            gather[s, : len(idx)] = idx
            self.seq_pos[idx] = s * self.k + torch.arange(len(idx))
        self.gather = gather.view(-1)
        # replicates admitted together sit in consecutive slots, in prompt order: then both gathers are no-ops
        self.identity = S * self.k == B and torch.equal(self.gather, torch.arange(B))

    def attend(self, q: torch.Tensor, layer: int, C: int):
        """Softmax pieces of every sequence's prompt part, each [B, R, *]."""
        B, R, W = q.shape
        if self.batched:
            G = self.table.shape[1]
            rows = self.table[layer]  # [S, P, width]
            qg = (q if self.identity else q[self.gather]).view(G, self.k * R, W)
            m, l, o = _pieces(qg, rows, self.lens, C)
            if self.identity:
                return (None if x is None else x.view(B, R, -1) for x in (m, l, o))
            return (None if x is None else x.view(G * self.k, R, -1)[self.seq_pos] for x in (m, l, o))
        qo = (q if self.identity else q[self.order]).view(-1, W)  # regrouped by prompt: each prompt's queries a slice
        parts, at = [], 0
        for kv, idx in self.groups:
            rows, n = kv.rows[layer], len(idx) * R
            m, l, o = _pieces(qo[None, at: at + n], rows[None], None, C)
            parts.append((m[0], torch.ones_like(m[0]) if l is None else l[0], o[0]))
            at += n
        out = (torch.cat([pt[i] for pt in parts]).view(B, R, -1) for i in range(3))
        return out if self.identity else (x[self.inv] for x in out)


def decode_attention(q: torch.Tensor, gen: torch.Tensor, gen_lens: torch.Tensor, prompts: PromptPlan, layer: int,
                     C: int) -> torch.Tensor:
    """Absorbed attention for B sequences with n new tokens each.

    q [B, R, C + dr] (R = n * H rows per sequence, scale folded in); gen [B, G, C + dr] the sequences' own rows
    (a view of the preallocated buffer, new rows already written); gen_lens [B, R or 1] the own rows each query row
    sees (length + causal). Returns [B, R, C].
    """
    m_g, l_g, o_g = _pieces(q, gen, gen_lens, C)
    m_p, l_p, o_p = prompts.attend(q, layer, C)
    if l_p is None and l_g is None:  # both normalised, m = log-sum-exp: the merge is a sigmoid-weighted blend
        return torch.lerp(o_g, o_p, torch.sigmoid(m_p - m_g))
    m = torch.maximum(m_g, m_p)
    a, b = torch.exp(m_p - m), torch.exp(m_g - m)
    return (o_p * a + o_g * b) / ((1.0 if l_p is None else l_p) * a + (1.0 if l_g is None else l_g) * b)
