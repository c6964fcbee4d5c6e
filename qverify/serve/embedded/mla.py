"""Multi-head latent attention over a latent cache, the way SGLang's MLA backends compute it.

The cache holds one latent row per token: the 512 compressed KV (after kv_a_layernorm) and the 64-value rope key
(after rope), rounded through FP8 when the build has an FP8 KV cache. Nothing is ever re-expanded per step:
- prefill (a new prompt) runs the MHA form: kv_b_proj (the loaded module) expands the prompt's latent once and
  causal attention runs per head, as SGLang's extend path does;
- decode and speculative verify run the absorbed MQA form (FlashMLA / trtllm_mla): kv_b_proj's key half is folded
  into the query (q_nope @ W_uk gives a 512-value query against the latent) and its value half into the output
  (attention over the latent, then @ W_uv), so each step reads the cached latent and nothing else.

Decode attention itself runs in qverify's CPU kernel (mqa_kernel.fused_decode: a whole layer in one call); without
it, in split_kv.py's torch form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers.models.deepseek_v3.modeling_deepseek_v3 import rotate_half

from qverify.serve.embedded.kv_fp8 import LayerFp8, fp8_cast, fp8_roundtrip
from qverify.serve.embedded.mqa_kernel import causal_prefill, rope_qk


def effective_weight(linear: torch.nn.Module) -> torch.Tensor:
    """The weight a compressed-tensors Linear multiplies by (its run-time weight fake quant applied), fp32.

    Absorption multiplies kv_b_proj's weight into the query and output, so it must be the weight compressed-tensors'
    forward would use. An activation-quantized kv_b_proj (FP8_DYNAMIC on the drafter: W8A8, per-token input) is
    absorbed as SGLang 0.5.23 absorbs it (deepseek_weight_loader.post_load_weights: the FP8 weight becomes w_kc/w_vc,
    and the latent is never passed through kv_b_proj, so its input quantization has nothing to act on). What is not
    emulated: SGLang re-scales that weight per tensor and runs the absorbed bmm in FP8 on a per-tensor-quantized
    query; here the absorbed product stays fp32 on the per-channel fake-quantized weight.
    """
    w = linear.weight.data
    scheme = getattr(linear, "quantization_scheme", None)
    status = getattr(linear, "quantization_status", None)
    if scheme is not None and status is not None and getattr(linear, "quantization_enabled", True):
        from compressed_tensors.quantization import QuantizationStatus
        from compressed_tensors.quantization.lifecycle.forward import forward_quantize

        if scheme.weights is not None and status < QuantizationStatus.COMPRESSED:
            w = forward_quantize(linear, w, "weight", scheme.weights)
    return w.float()


@dataclass
class Projected:
    """One layer's per-token attention inputs for N tokens."""

    q_nope: torch.Tensor  # [N, H, qk_nope]
    q_rot: torch.Tensor  # [N, H, rope]
    latent: torch.Tensor  # [N, kv_lora + rope], fresh (what SGLang's prefill expands)
    cached: torch.Tensor  # the same rows as cached (FP8-rounded when the cache is FP8, else `latent` itself)


def rms_norm_into(norm: torch.nn.Module, x: torch.Tensor, out: torch.Tensor) -> None:
    """out[...] = norm(x) for transformers' DeepseekV3RMSNorm (also the name in DeepSeek's and Kimi's remote
    code, with the same forward): its ops one for one in fp32, so the same bits, with the last product written
    straight into `out`. Why: `out` is a strided slice of the latent buffer, and assigning the module's result there
    cost a temporary and a strided copy, about as much as the norm itself. Other norms or dtypes: the module."""
    w = norm.weight
    if type(norm).__name__ != "DeepseekV3RMSNorm" or not (x.dtype == out.dtype == w.dtype == torch.float32):
        out.copy_(norm(x))
        return
    variance = x.pow(2).mean(-1, keepdim=True)
    torch.mul(w, x * torch.rsqrt(variance + norm.variance_epsilon), out=out)


def rope_tables(rotary_emb: torch.nn.Module, positions: torch.Tensor, x: torch.Tensor,
                cache: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 1, rope] at `positions` [N]: rows of a table the model's own rotary module computed once for
    positions 0..L-1 (its angles are one product each and cos/sin elementwise, so a row equals what a per-step
    call at that position gives, bit for bit). Dynamic rope types (whose frequencies depend on the length seen)
    call the module every time."""
    if getattr(rotary_emb, "rope_type", "default") in ("dynamic", "longrope"):
        cos, sin = rotary_emb(x, positions[None])
        return cos[0, :, None], sin[0, :, None]
    need = int(positions.max()) + 1
    if cache.get("len", 0) < need:
        n = max(need, 2 * cache.get("len", 1024))
        cos, sin = rotary_emb(x[:, :1], torch.arange(n)[None])
        cache.update(len=n, cos=cos[0, :, None], sin=sin[0, :, None])
    return cache["cos"][positions], cache["sin"][positions]


def rope_rows(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool) -> torch.Tensor:
    """transformers' apply_rotary_pos_emb(_interleave) on x [N, heads, rope], the same expressions in the same order
    (so the same bits), for any number of heads at once; cos, sin [N, 1, rope]."""
    if not interleave:
        return (x * cos) + (rotate_half(x) * sin)
    cos, sin = cos[..., : cos.shape[-1] // 2], sin[..., : sin.shape[-1] // 2]
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


PREFILL_BLOCK = 64  # query rows per block (A/B on prompts of 180-1,000 tokens: 64 beat 32, 128 and 256)
_ABOVE_DIAGONAL = torch.ones(PREFILL_BLOCK, PREFILL_BLOCK, dtype=torch.bool).triu(1)  # a diagonal block's mask


def causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, offset: int = 0) -> torch.Tensor:
    """softmax(q k^T * scale, causal) v for q [H, n, d], k [H, offset + n, d], v [H, offset + n, dv] -> [H, n, dv]:
    query row i sees keys 0..offset + i (offset: the rows of a cached prefix before the n new tokens).

    Why not torch's SDPA: its fused CPU kernel wants V as wide as Q/K (dv 32 against 96 here: else its math path,
    3x slower), so V had to be padded and two thirds of the P @ V work were zeros; and at 4 heads it ran at 20-35
    GFLOP/s. Here each block of query rows is two batched GEMMs against the keys up to its last row (the masked
    upper triangle is only computed inside the diagonal block) with an exact softmax in between: 5-10% slower than
    padded SDPA below ~100 tokens, 1.2-1.4x faster from ~250 (single-thread microbenchmarks), within 1e-6 of it in fp32.
    Where qverify's kernel is built (mqa_kernel.causal_prefill, prefill_kernel.cpp) it runs instead: one flash-style
    pass, 1.6-2.4x faster single-threaded at 64-2,000 tokens (benchmarks/prefill_attention.py); the torch code
    below is the fallback.
    Half-precision inputs are computed in fp32 (as the fused kernel accumulates) and the result cast back."""
    if q.dtype != torch.float32:
        return causal_attention(q.float(), k.float(), v.float(), scale, offset).to(v.dtype)
    out = causal_prefill(q, k, v, scale) if offset == 0 else None  # [n, H, dv] (the kernel's keys are its queries)
    if out is not None:
        return out.transpose(0, 1)
    H, n, _ = q.shape
    out = torch.empty(H, n, v.shape[-1])
    B, above, m = PREFILL_BLOCK, _ABOVE_DIAGONAL, offset
    for s in range(0, n, B):
        t = min(n, s + B)
        scores = torch.matmul(q[:, s:t], k[:, : m + t].transpose(-1, -2)) * scale
        scores[..., m + s:].masked_fill_(above[: t - s, : t - s], float("-inf"))
        torch.matmul(torch.softmax(scores, -1), v[:, : m + t], out=out[:, s:t])
    return out


class MLALayer:
    """One decoder layer's attention: calls the loaded module's Linear layers; attends over the latent cache."""

    def __init__(self, attn: torch.nn.Module, config, fp8: LayerFp8 | None = None):
        self.attn = attn
        self.rope_interleave = bool(getattr(config, "rope_interleave", False))
        self.H, self.dn, self.dr = attn.num_heads, attn.qk_nope_head_dim, attn.qk_rope_head_dim
        self.dv, self.C = attn.v_head_dim, attn.kv_lora_rank
        self.scaling = float(attn.scaling)
        self.fp8 = fp8  # None: no FP8 KV (kv_fp8.py: how SGLang's backend writes and reads it)
        self.kv_scale = fp8.cache_scale if fp8 is not None else None  # [C + dr] per-value scale of the cache write
        # decode logits' factor, folded into the query (trtllm_mla's bmm1_scale = k_scale * softmax scale)
        self.q_mult = self.scaling * (fp8.logit_scale if fp8 is not None else 1.0)
        w = effective_weight(attn.kv_b_proj).view(self.H, self.dn + self.dv, self.C)
        self.w_uk = w[:, : self.dn, :].contiguous()  # [H, dn, C]
        self.w_uv_t = w[:, self.dn:, :].transpose(1, 2).contiguous()  # [H, C, dv]

    @property
    def width(self) -> int:
        return self.C + self.dr

    def project(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> Projected:
        """h [1, N, hidden] -> queries and the latent rows to cache (HF's DeepseekV3Attention, before attention);
        cos, sin [N, 1, rope] (rope_tables)."""
        a = self.attn
        n = h.shape[1]
        q = a.q_proj(h) if a.q_lora_rank is None else a.q_b_proj(a.q_a_layernorm(a.q_a_proj(h)))
        q = q.view(n, self.H, self.dn + self.dr)
        kv = a.kv_a_proj_with_mqa(h)[0]  # [N, C + dr]
        latent = torch.empty(n, self.width, dtype=torch.promote_types(kv.dtype, cos.dtype))  # (as a cat of the two)
        q_rot = rope_qk(q, kv, cos, sin, self.dn, self.rope_interleave, latent)  # writes latent[:, C:]
        if q_rot is None:  # no kernel: the H query heads' rope parts and the key's in one pass of torch ops
            rot = rope_rows(torch.cat([q[..., self.dn:], kv[:, None, self.C:]], 1), cos, sin, self.rope_interleave)
            q_rot, latent[:, self.C:] = rot[:, : self.H], rot[:, self.H]
        rms_norm_into(a.kv_a_layernorm, kv[:, : self.C], latent[:, : self.C])
        cached = latent if self.kv_scale is None else fp8_roundtrip(latent, self.kv_scale)
        return Projected(q[..., : self.dn], q_rot, latent, cached)

    def prefill(self, p: Projected, prefix: torch.Tensor | None = None) -> torch.Tensor:
        """Causal MHA over one prompt's new tokens: [n, H * dv] (kv_b_proj expands the latent once).
        SGLang expands the fresh latent (its MHA prefill never reads the cache it writes); trtllm_mla then casts
        q, k, v to FP8 with scale 1 (kv_fp8.py). compressed-tensors' HF forward expands the rounded one.

        `prefix` [m, width]: cached rows before the new tokens (a radix hit or an earlier chunk: prefix_reads.py),
        as the pool holds them (FP8-rounded). SGLang 0.5.23 reads them back:
        - trtllm_mla / cutedsl_mla, MHA_CHUNKED_KV: the new tokens' K/V from their fresh latent as above
          (forward_mha.py:253-294), the prefix's gathered from the pool, dequantized and re-expanded with kv_b_proj
          (forward_mha.py:520-563, _get_mla_kv_buffer 628-649), both kernels casting q, k, v to FP8 at scale 1
          (trtllm_mla_backend.py:1080-1081), the two merged by log-sum-exp (forward_mha.py:579: the same softmax
          over all keys at once, as here);
        - flashinfer: every K/V row is the rounded latent, the new tokens' own too: the absorbed path writes them
          first and reads the pool `.to(q.dtype)` (flashinfer_mla_backend.py:761), MHA_ONE_SHOT (from 8,192 prefix
          tokens) re-reads every row (forward_mha.py:254-287); the query is not cast."""
        f = self.fp8
        rounded_own = f is not None and (f.prefill_from_cache or (prefix is not None and not f.extend_fresh_tail))
        own = p.cached if rounded_own else p.latent
        latent = own if prefix is None else torch.cat([prefix, own])
        n, L, H, dn = own.shape[0], latent.shape[0], self.H, self.dn
        kv = self.attn.kv_b_proj(latent[:, : self.C].unsqueeze(0))[0].view(L, H, dn + self.dv)
        # heads first, each contiguous: what the batched GEMMs read
        q = torch.cat([p.q_nope.transpose(0, 1), p.q_rot.transpose(0, 1)], dim=-1)
        k = torch.cat([kv[..., :dn].transpose(0, 1), latent[None, :, self.C:].expand(H, L, self.dr)], dim=-1)
        v = kv[..., dn:].transpose(0, 1).contiguous()
        if f is not None and f.prefill_fp8 and q.dtype == torch.float32:
            q, k, v = fp8_cast(q), fp8_cast(k), fp8_cast(v)
        return causal_attention(q, k, v, self.scaling, L - n).transpose(0, 1).reshape(n, H * self.dv)

    def absorbed_query(self, p: Projected) -> torch.Tensor:
        """[N, H, C + dr] queries against the latent, softmax scale (and trtllm_mla's k_scale) folded in; rounded
        through FP8 first where the backend casts its query (trtllm_mla, cutedsl_mla)."""
        # the product lands in its slice of the result (no cat; the same bits: scaled after, in place)
        q = torch.empty(p.q_nope.shape[0], self.H, self.width)
        torch.bmm(p.q_nope.transpose(0, 1), self.w_uk, out=q[:, :, : self.C].transpose(0, 1))  # [N, H, C]
        q[:, :, self.C:] = p.q_rot
        if self.fp8 is not None and self.fp8.query_fp8:
            q = fp8_cast(q)
        return q.mul_(self.q_mult)

    def output(self, o_lat: torch.Tensor) -> torch.Tensor:
        """[N, H, C] attention output over the latent -> [N, H * dv] (W_uv absorbed on the way out)."""
        return torch.bmm(o_lat.transpose(0, 1), self.w_uv_t).transpose(0, 1).reshape(o_lat.shape[0], -1)
