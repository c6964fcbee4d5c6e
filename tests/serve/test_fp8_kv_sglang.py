"""The engine's FP8-KV attention against SGLang 0.5.23's own FP8 MLA code, cut from its installed source
(tests/sglang_ref/sglang_source.py: its modules do not import on CPU) and run on CPU tensors.

SGLang's code run as is: `mla_quantize_without_rope_for_fp8` (+ `concat_mla_absorb_q_general`), the pool's
`MLATokenToKVPool._write_mla_kv_buffer`, `TRTLLMMLABackend._compute_decode_bmm1_scale`, `_quantize_fp8_qkv`.
Stand-ins, at the GPU boundary only: the pool's row scatter (`_scatter_mla_rows`, a CUDA kernel: here an index
copy) and the attention kernels themselves (flashinfer's trtllm-gen decode and ragged prefill, CUDA: here their
documented math in float64, softmax(q k^T * bmm1_scale) v with V the latent's first kv_lora_rank values).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from qverify.serve.embedded.kv_fp8 import layer_fp8
from qverify.serve.embedded.mla import MLALayer, rope_tables
from qverify.serve.embedded.mqa_kernel import attention_pieces
from tests.sglang_ref.sglang_source import method, module_function

FP8 = torch.float8_e4m3fn
UTILS = "sglang.kernels.ops.attention.utils"
TRTLLM = "sglang.srt.layers.attention.trtllm_mla_backend"
POOL = "sglang.srt.mem_cache.memory_pool"
N = 40  # tokens in the context


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def sglang():
    scope = {"torch": torch, "_is_cuda": False}
    module_function(UTILS, "concat_mla_absorb_q_general", scope)
    return SimpleNamespace(
        quantize=module_function(UTILS, "mla_quantize_without_rope_for_fp8", scope),
        write=method(POOL, "MLATokenToKVPool._write_mla_kv_buffer", {"torch": torch, "_is_hip": False, "fp8_dtype": FP8}),
        bmm1_scale=method(TRTLLM, "TRTLLMMLABackend._compute_decode_bmm1_scale", {"torch": torch, "logger": None}),
        quantize_qkv=module_function(TRTLLM, "_quantize_fp8_qkv", {"torch": torch}),
    )


def _layer(model, backend: str, k_scale: float = 1.0):
    """Layer 0 as the engine runs it for an FP8-KV build, over N random hidden states."""
    attn = model.model.layers[0].self_attn
    mla = MLALayer(attn, model.config, layer_fp8(attn, 0, "production", backend, {0: k_scale}))
    h = torch.randn(1, N, model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    cos, sin = rope_tables(model.model.rotary_emb, torch.arange(N), h, {})
    with torch.no_grad():
        return mla, mla.project(h, cos, sin)


def _engine_decode(mla, p) -> torch.Tensor:
    """The last token's absorbed attention over all N cached rows, as the engine's decode runs it: [H, C]."""
    q = mla.absorbed_query(p)[-1:]  # [1, H, W]
    _, o = attention_pieces(q, p.cached[None], None, mla.C)
    return o[0]


def _sglang_cache(sglang, mla, k_nope, k_rope) -> torch.Tensor:
    """SGLang's pool write of N rows (its code), read back as its kernels see the cache: [N, W] fp8 values."""
    buf = torch.zeros(N, 1, mla.width, dtype=torch.uint8)

    def scatter(dst, loc, nope, rope):  # stand-in for the CUDA scatter kernel: byte rows into their slots
        dst[loc, 0, : mla.C], dst[loc, 0, mla.C:] = nope.reshape(len(loc), -1), rope.reshape(len(loc), -1)

    pool = SimpleNamespace(dtype=FP8, store_dtype=torch.uint8, use_dsa=False, dsa_kv_cache_store_fp8=False,
                           write_loc_is_dcp_resolved=False, _scatter_mla_rows=scatter)
    sglang.write(pool, buf, torch.arange(N), k_nope[:, None], k_rope[:, None])
    return buf.view(FP8)[:, 0]  # get_key_buffer: the uint8 store viewed as the pool dtype


def _attend(q: torch.Tensor, kv: torch.Tensor, bmm1_scale: float, C: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The decode kernel's math (a CUDA kernel in SGLang): q [H, W], kv [N, W] -> (output [H, C], logits [H, N]),
    in float64."""
    s = (q.double() @ kv.double().T) * bmm1_scale
    return torch.softmax(s, -1) @ kv[:, :C].double(), s


def _sglang_decode(sglang, mla, p, backend: str, k_scale: float = 1.0):
    """What SGLang computes for the last token: (output [H, C], its attention logits [H, N], the cache it wrote)."""
    q_nope = torch.bmm(p.q_nope.transpose(0, 1), mla.w_uk).transpose(0, 1)  # the absorbed query SGLang's model passes
    k_nope, k_rope = p.latent[:, : mla.C], p.latent[:, mla.C:]
    layer = SimpleNamespace(k_scale_float=k_scale, scaling=mla.scaling)
    if backend == "trtllm_mla":  # forward_decode's FP8 branch: quantize q and k (scale 1), write, scale the logits
        q, k_nope, k_rope = sglang.quantize(q_nope, p.q_rot, k_nope, k_rope)
        kv = _sglang_cache(sglang, mla, k_nope, k_rope)
        scale = sglang.bmm1_scale(SimpleNamespace(data_type=FP8), layer)
    else:  # flashinfer: the pool casts; the cache is read back `.to(q.dtype)`; sm_scale = layer.scaling
        kv = _sglang_cache(sglang, mla, k_nope, k_rope)
        q, scale = torch.cat([q_nope, p.q_rot], -1), mla.scaling
    return (*_attend(q[-1].float(), kv.float(), scale, mla.C), kv)


@pytest.mark.parametrize("backend", ["trtllm_mla", "flashinfer"])
def test_engine_decode_equals_sglangs_fp8_write_and_read(model, sglang, backend):
    mla, p = _layer(model, backend)
    want, _, kv = _sglang_decode(sglang, mla, p, backend)
    assert torch.equal(p.cached, kv.float())  # the engine caches exactly SGLang's bytes (scale 1, both parts)
    got = _engine_decode(mla, p)
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()
    # and the FP8 query is really in: without it the output moves well beyond that tolerance
    if backend == "trtllm_mla":
        plain = _sglang_decode(sglang, mla, p, "flashinfer")[0]
        assert (plain - want).abs().max() > 100 * (got.double() - want).abs().max()


def test_a_loaded_scale_multiplies_decode_logits_on_trtllm_mla(model, sglang):
    """What every fp8kv build did before issue #28: its calibrated amax/448 reached SGLang as k_scale. The cache SGLang
    writes is the same bytes, and the decode logits are multiplied by the scale; the engine reproduces it."""
    s = 0.0113  # amax/448 of qverify-tiny's latent, about
    mla1, p1 = _layer(model, "trtllm_mla")
    mla_s, p_s = _layer(model, "trtllm_mla", k_scale=s)
    layer = SimpleNamespace(k_scale_float=s, scaling=mla1.scaling)
    assert sglang.bmm1_scale(SimpleNamespace(data_type=FP8), layer) == s * mla1.scaling
    good, logits1, kv1 = _sglang_decode(sglang, mla1, p1, "trtllm_mla")
    bad, logits_s, kv_s = _sglang_decode(sglang, mla_s, p_s, "trtllm_mla", k_scale=s)
    assert torch.equal(kv1.view(torch.uint8), kv_s.view(torch.uint8))  # the write ignores the scale
    assert torch.allclose(logits_s, s * logits1, rtol=1e-12, atol=0)  # every decode logit times the build's scale
    got = _engine_decode(mla_s, p_s)  # the engine serves the same damage
    assert (got.double() - bad).abs().max() < 1e-5 * bad.abs().max()
    assert (got.double() - good).abs().max() > 100 * (got.double() - bad).abs().max()
    # flashinfer never reads it: the same scaled build is harmless there
    mla_f, _ = _layer(model, "flashinfer", k_scale=s)
    assert mla_f.q_mult == mla_f.scaling


def test_engine_prefill_equals_trtllm_mlas_fp8_prefill(model, sglang):
    """Prefill (MHA over the fresh latent): trtllm_mla casts q, k, v to FP8 with attn_mha's scale 1."""
    mla, p = _layer(model, "trtllm_mla", k_scale=0.25)  # attn_mqa's scale does not reach prefill
    with torch.no_grad():
        got = mla.prefill(p).view(N, mla.H, mla.dv)
        kv = mla.attn.kv_b_proj(p.latent[:, : mla.C]).view(N, mla.H, mla.dn + mla.dv)
    q = torch.cat([p.q_nope, p.q_rot], -1)
    k = torch.cat([kv[..., : mla.dn], p.latent[:, None, mla.C:].expand(N, mla.H, mla.dr)], -1)
    attn_mha = SimpleNamespace(k_scale_float=1.0, v_scale_float=1.0)
    q8, k8, v8, ks, vs = sglang.quantize_qkv(q, k, kv[..., mla.dn:], attn_mha)
    s = torch.einsum("qhd,khd->hqk", q8.double(), k8.double()) * (ks * mla.scaling)
    s = s.masked_fill(torch.ones(N, N, dtype=torch.bool).triu(1), float("-inf"))
    want = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), v8.double()) * vs
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()


M = 24  # of the N tokens, the cached prefix (a radix hit or an earlier chunk); the last N - M are prefilled over it


def _tail(p, m: int = M):
    from qverify.serve.embedded.mla import Projected

    return Projected(p.q_nope[m:], p.q_rot[m:], p.latent[m:], p.cached[m:])


def test_prefill_over_a_cached_prefix_reads_it_from_trtllm_mlas_fp8_pool(model, sglang):
    """MHA_CHUNKED_KV (issue #36.5): the new tokens' K/V from their fresh latent, the prefix's from the bytes SGLang's
    pool holds (its write, run here) re-expanded with kv_b_proj; each part's q, k, v through SGLang's own
    `_quantize_fp8_qkv` (attn_mha's scale 1); one softmax over both (SGLang merges the two by log-sum-exp)."""
    mla, p = _layer(model, "trtllm_mla")
    k_nope, k_rope = sglang.quantize(torch.zeros(N, mla.H, mla.C), p.q_rot, p.latent[:, : mla.C], p.latent[:, mla.C:])[1:]
    pool = _sglang_cache(sglang, mla, k_nope, k_rope).float()[:M]
    with torch.no_grad():
        got = mla.prefill(_tail(p), pool).view(N - M, mla.H, mla.dv)
        fresh = mla.prefill(p).view(N, mla.H, mla.dv)[M:]  # today's engine: the whole prompt prefilled fresh

        def qkv(latent):
            kv = mla.attn.kv_b_proj(latent[:, : mla.C]).view(-1, mla.H, mla.dn + mla.dv)
            k = torch.cat([kv[..., : mla.dn], latent[:, None, mla.C:].expand(-1, mla.H, mla.dr)], -1)
            q = torch.cat([p.q_nope, p.q_rot], -1)[M:]
            return sglang.quantize_qkv(q, k, kv[..., mla.dn:], SimpleNamespace(k_scale_float=1.0, v_scale_float=1.0))

    q8, k_new, v_new, _, _ = qkv(p.latent[M:])
    _, k_pre, v_pre, _, _ = qkv(pool)
    s_new = torch.einsum("qhd,khd->hqk", q8.double(), k_new.double()) * mla.scaling
    s_new = s_new.masked_fill(torch.ones(N - M, N - M, dtype=torch.bool).triu(1), float("-inf"))
    s_pre = torch.einsum("qhd,khd->hqk", q8.double(), k_pre.double()) * mla.scaling
    prob = torch.softmax(torch.cat([s_pre, s_new], -1), -1)
    want = torch.einsum("hqk,khd->qhd", prob, torch.cat([v_pre, v_new]).double())
    err = (got.double() - want).abs().max()
    assert err < 1e-5 * want.abs().max()
    assert (fresh.double() - want).abs().max() > 30 * err  # the fresh prefix is measurably not what SGLang computes


def test_prefill_over_a_cached_prefix_reads_every_row_from_flashinfers_pool(model, sglang):
    """flashinfer: the new rows are written first and every row is read back `.to(q.dtype)`, the query not cast;
    reference in the absorbed form flashinfer's MLA kernel computes (q_nope W_uk against the latent, W_uv after)."""
    mla, p = _layer(model, "flashinfer")
    pool = _sglang_cache(sglang, mla, p.latent[:, : mla.C], p.latent[:, mla.C:]).double()
    with torch.no_grad():
        got = mla.prefill(_tail(p), pool[:M].float()).view(N - M, mla.H, mla.dv)
    q = torch.cat([torch.einsum("qhd,hdc->qhc", p.q_nope.double(), mla.w_uk.double()), p.q_rot.double()], -1)[M:]
    s = torch.einsum("qhw,kw->hqk", q, pool) * mla.scaling
    s = s.masked_fill(torch.ones(N - M, N, dtype=torch.bool).triu(M + 1), float("-inf"))
    want = torch.einsum("hqk,kc,hcd->qhd", torch.softmax(s, -1), pool[:, : mla.C], mla.w_uv_t.double())
    assert (got.double() - want).abs().max() < 1e-5 * want.abs().max()
