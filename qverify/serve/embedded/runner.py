"""One model's forward over a latent cache: the loaded modules for everything but attention.

Embeddings, norms, every Linear (q/kv/o projections, dense MLP, shared and routed experts, lm_head) and the MoE
blocks are the modules as qverify's integrity-checked loader returned them, called as they are, so
compressed-tensors' own forward (NVFP4 weight + activation fake quant, pack-quantized experts) stays the numerical
reference. Only attention is replaced (mla.py), because transformers' re-expands the whole cache every step.

Cache layout (preallocated, no per-step concatenation):
- a prompt's latent rows live in its `PromptKV` ([layers, P, width]), written once by prefill and shared by
  every sequence with that prompt;
- each running sequence owns slot b of `gen` ([layers, slots, cap, width]); running sequences occupy slots
  0..B-1, so `gen[l, :B, :G]` is a view that one batched GEMM reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from qverify.serve.embedded.kv_fp8 import DEFAULT_BACKEND, ScaleMode, kv_quant_enabled, layer_fp8
from qverify.serve.embedded.mla import MLALayer, rope_tables
from qverify.serve.embedded.moe import moe_forward, plain_fused_experts
from qverify.serve.embedded.mqa_kernel import fused_decode
from qverify.serve.embedded.mqa_kernel import load as load_attention_kernel
from qverify.serve.embedded.mqa_kernel import ready as kernel_ready
from qverify.serve.embedded.prefix_reads import chunk_starts
from qverify.serve.embedded.split_kv import PromptPlan, PromptTable, decode_attention


@dataclass
class PromptKV:
    rows: torch.Tensor  # [layers, P, width]


class ModelRunner:
    def __init__(self, model, slots: int, fp8_kv: bool = False, scale_mode: ScaleMode = "production",
                 sglang_scales: dict[int, float] | None = None, cap: int = 128, attention_backend: str = DEFAULT_BACKEND):
        self.model = model
        self.cfg = model.config
        self.layers = list(model.model.layers)
        self.mla = []
        for i, layer in enumerate(self.layers):
            a = layer.self_attn
            fp8 = layer_fp8(a, i, scale_mode, attention_backend, sglang_scales) if fp8_kv and kv_quant_enabled(a) else None
            self.mla.append(MLALayer(a, self.cfg, fp8))
        self.batched_moe = [plain_fused_experts(layer.mlp) for layer in self.layers]
        self.width = self.mla[0].width
        self.C = self.mla[0].C
        self.slots = slots
        # grown on demand (ensure_capacity): a server sized for 256 sequences that serves 3 holds 3 slots' rows
        self.gen = torch.zeros(len(self.layers), min(slots, 8), cap, self.width)
        self._reserve = 0  # rows the next growth goes to at least (reserve)
        self.table = PromptTable(len(self.layers), self.width)  # live prompts, padded, for batched decode reads
        self._plan: tuple[list, _FusedPlan, PromptPlan | None] | None = None
        self._rope: dict = {}  # the rotary module's cos/sin for positions 0..len-1 (mla.rope_tables)
        # EAGLE3: the layers whose inputs each forward keeps, concatenated in `aux` [tokens, len * hidden]
        self.capture: list[int] = []
        self.aux: torch.Tensor | None = None
        self.chunk: int | None = None  # chunked prefill's size (prefix_reads.py); None: every prompt in one piece
        load_attention_kernel()  # built once per machine (~40 s), here rather than inside the first decode step

    @property
    def fp8_kv(self) -> bool:
        return any(m.kv_scale is not None for m in self.mla)

    def ensure_capacity(self, rows: int, seqs: int) -> None:
        """Room for `seqs` running sequences (slots 0..seqs-1, the live ones) of `rows` generated rows each
        (doubling either, or straight to `reserve`; rare, and copies only the live sequences' rows)."""
        slots, cap = self.gen.shape[1:3]
        if rows <= cap and seqs <= slots:
            return
        while cap < rows:
            cap *= 2
        if rows > self.gen.shape[2]:
            cap = max(cap, self._reserve)
        while slots < seqs:
            slots = min(2 * slots, max(self.slots, seqs))
        # uninitialised where the kernel reads: it never reads a row a sequence has not written (and zeroing
        # the grown buffer was 4% of a benchmark run); the split-KV fallback reads masked rows, which must be finite
        new = (torch.empty if kernel_ready() else torch.zeros)(self.gen.shape[0], slots, cap, self.width)
        live_seqs, live_rows = min(seqs, self.gen.shape[1]), min(rows, self.gen.shape[2])  # what holds written rows
        new[:, :live_seqs, :live_rows] = self.gen[:, :live_seqs, :live_rows]
        self.gen = new

    def reserve(self, rows: int) -> None:
        """The most generated rows a running sequence can reach (the engine's max_tokens bound): when the rows
        outgrow the buffer, it grows straight to that, once, instead of doubling (each doubling copied the whole
        buffer). Only with the kernel, whose buffer is uninitialised: a page costs nothing until a row is written."""
        self._reserve = rows if kernel_ready() else 0

    def move_slot(self, src: int, dst: int, rows: int) -> None:
        self.gen[:, dst, :rows] = self.gen[:, src, :rows]

    def _embed(self, ids: torch.Tensor, positions: torch.Tensor):
        x = self.model.model.embed_tokens(ids[None])
        cos, sin = rope_tables(self.model.model.rotary_emb, positions, x, self._rope)
        return x, cos, sin

    def _mlp(self, li: int, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        layer = self.layers[li]
        x = x + layer.self_attn.o_proj(attn_out[None])
        h = layer.post_attention_layernorm(x)
        return x + (moe_forward(layer.mlp, h) if self.batched_moe[li] else layer.mlp(h))

    def _logits(self, x: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
        x = self.model.model.norm(x)[0]
        if rows is not None:
            x = x[rows]
        return self.model.lm_head(x).float()

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], logit_rows: torch.Tensor) -> tuple[list[PromptKV], torch.Tensor]:
        """Run new prompts (flattened into one forward); returns their caches and the logits at `logit_rows`
        (indices into the flattened tokens). A prompt longer than `chunk` is prefilled chunk by chunk, each chunk
        over the rows of the ones before as the cache holds them (SGLang's chunked prefill: prefix_reads.py)."""
        if all(len(chunk_starts(len(p), self.chunk)) == 1 for p in prompts):
            return self._prefill(prompts, logit_rows)
        kvs, logits, aux, start = [], [], [], 0
        for p in prompts:  # (rare: one at a time)
            mine = logit_rows[(logit_rows >= start) & (logit_rows < start + len(p))] - start
            kv, lg = self._chunked(p, mine)
            kvs.append(kv)
            logits.append(lg)
            aux.append(self.aux)
            start += len(p)
        self.aux = None if aux[0] is None else torch.cat(aux)
        return kvs, torch.cat(logits)

    def _chunked(self, ids: list[int], rows: torch.Tensor) -> tuple[PromptKV, torch.Tensor]:
        starts = chunk_starts(len(ids), self.chunk)
        kv, logits, aux = None, [], []
        for s, e in zip(starts, [*starts[1:], len(ids)]):
            mine = rows[(rows >= s) & (rows < e)] - s
            if kv is None:
                kvs, lg = self._prefill([ids[s:e]], mine)
                kv = kvs[0]
            else:
                kv, lg = self.extend(kv, s, ids[s:e], mine)
            logits.append(lg)
            aux.append(self.aux)
        self.aux = None if aux[0] is None else torch.cat(aux)
        return kv, torch.cat(logits)

    @torch.no_grad()
    def extend(self, prefix: PromptKV, m: int, tail: list[int], logit_rows: torch.Tensor) -> tuple[PromptKV, torch.Tensor]:
        """Prefill `tail` after the first m cached rows of `prefix`, read as the pool holds them (FP8-rounded for an
        FP8 cache; mla.MLALayer.prefill says how each backend reads them): a radix hit or a later chunk
        (prefix_reads.py). Returns the cache of all m + len(tail) rows and the logits at `logit_rows` (into tail)."""
        n = len(tail)
        kv = PromptKV(torch.empty(len(self.layers), m + n, self.width))
        kv.rows[:, :m] = prefix.rows[:, :m]
        x, cos, sin = self._embed(torch.tensor(tail), torch.arange(m, m + n))
        aux = []
        for li, (layer, mla) in enumerate(zip(self.layers, self.mla)):
            if li in self.capture:
                aux.append(x[0])
            p = mla.project(layer.input_layernorm(x), cos, sin)
            kv.rows[li, m:] = p.cached
            x = self._mlp(li, x, mla.prefill(p, prefix.rows[li, :m]))
        self.aux = torch.cat(aux, -1) if aux else None
        return kv, self._logits(x, logit_rows)

    def _prefill(self, prompts: list[list[int]], logit_rows: torch.Tensor) -> tuple[list[PromptKV], torch.Tensor]:
        lens = [len(p) for p in prompts]
        ids = torch.tensor([t for p in prompts for t in p])
        pos = torch.cat([torch.arange(n) for n in lens])
        kvs = [PromptKV(torch.empty(len(self.layers), n, self.width)) for n in lens]
        x, cos, sin = self._embed(ids, pos)
        aux = []
        for li, (layer, mla) in enumerate(zip(self.layers, self.mla)):
            if li in self.capture:
                aux.append(x[0])
            p = mla.project(layer.input_layernorm(x), cos, sin)
            outs, start = [], 0
            for kv, n in zip(kvs, lens):
                sl = slice(start, start + n)
                kv.rows[li] = p.cached[sl]
                outs.append(mla.prefill(type(p)(p.q_nope[sl], p.q_rot[sl], p.latent[sl], p.cached[sl])))
                start += n
            x = self._mlp(li, x, torch.cat(outs))
        self.aux = torch.cat(aux, -1) if aux else None
        return kvs, self._logits(x, logit_rows)

    @torch.no_grad()
    def decode(self, ids: torch.Tensor, positions: torch.Tensor, gen_len: torch.Tensor,
               groups: list[tuple[PromptKV, torch.Tensor]]) -> torch.Tensor:
        """n new tokens for each of B running sequences (slots 0..B-1): ids, positions [B, n]; gen_len [B] rows
        each already holds. Writes the new rows, returns logits [B, n, vocab]."""
        B, n = ids.shape
        H = self.mla[0].H
        G = int(gen_len.max()) + n
        self.ensure_capacity(G, B)
        # query j of a sequence sees its own rows < gen_len + j + 1 (one length for all its heads when n == 1)
        seen = gen_len[:, None] + torch.arange(1, n + 1)[None, :]
        seen = seen if n == 1 else seen[:, :, None].expand(B, n, H).reshape(B, n * H)
        write = (gen_len[:, None] + torch.arange(n)[None, :]).reshape(-1)
        # the new rows' places in a layer's [slots * cap, width] view (index_copy_: ~4x cheaper than index_put_)
        write = torch.arange(B).repeat_interleave(n) * self.gen.shape[2] + write
        if self._plan is None or self._plan[0] is not groups:  # the engine passes the same list while nothing joins/leaves
            self._plan = (groups, _FusedPlan(groups, B, len(self.layers)), None)
        x, cos, sin = self._embed(ids.reshape(-1), positions.reshape(-1))
        aux = []
        for li, (layer, mla) in enumerate(zip(self.layers, self.mla)):
            if li in self.capture:
                aux.append(x[0])
            p = mla.project(layer.input_layernorm(x), cos, sin)
            self.gen[li].view(-1, self.width).index_copy_(0, write, p.cached.to(self.gen.dtype))
            q = mla.absorbed_query(p).view(B, n * H, self.width)
            f = self._plan[1]
            o = fused_decode(q, f.prompts[li], f.prompt_of, self.gen[li, :B, :G], seen, f.order, self.C)
            if o is None:  # no kernel: split-KV over torch's kernels (split_kv.py)
                if self._plan[2] is None:
                    self._plan = (*self._plan[:2], PromptPlan(groups, B, self.table))
                o = decode_attention(q, self.gen[li, :B, :G], seen, self._plan[2], li, self.C)
            x = self._mlp(li, x, mla.output(o.view(B * n, H, self.C)))
        self.aux = torch.cat(aux, -1).view(B, n, -1) if aux else None
        return self._logits(x, None).view(B, n, -1)


class _FusedPlan:
    """What mqa_kernel.fused_decode needs about the running sequences' prompts, per layer (rebuilt when the batch
    changes): each prompt's rows, each sequence's prompt, and the sequences by prompt."""

    def __init__(self, groups: list[tuple[PromptKV, torch.Tensor]], B: int, layers: int):
        self.prompts = [[kv.rows[li] for kv, _ in groups] for li in range(layers)]
        self.prompt_of = torch.empty(B, dtype=torch.long)
        for g, (_, idx) in enumerate(groups):
            self.prompt_of[idx] = g
        self.order = torch.cat([idx for _, idx in groups])
