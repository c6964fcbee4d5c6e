"""qverify's decode-attention kernel (serve/embedded/mqa_kernel.py), the blocked prefill attention (mla.py) and the
one-pass rope, against references that share none of their code: an explicit float64 softmax, transformers' rope
functions, and the benchmark's FLOP count against a hand count."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest
import torch

from qverify.serve.embedded import mqa_kernel

HAS_COMPILER = shutil.which("c++") is not None and shutil.which("ninja") is not None


@pytest.fixture(params=["qverify", "torch-flash"])
def kernel(request, monkeypatch):
    """Each test runs on qverify's kernel and on the fallback (torch's flash kernel, what a box without a compiler
    gets)."""
    if request.param == "qverify":
        if not HAS_COMPILER:
            pytest.skip("no C++ compiler / ninja here: the fallback is what runs")
        assert mqa_kernel.load() is not None, "the kernel should build where a compiler is present"
    else:
        monkeypatch.setitem(mqa_kernel._STATE, "ext", None)
    return request.param


def _reference(q, rows, lens, C):
    """Softmax pieces in float64 with an explicit mask: (log-sum-exp [N, R, 1], output [N, R, C])."""
    s = torch.einsum("nrw,nlw->nrl", q.double(), rows.double())
    if lens is not None:
        s = s.masked_fill(torch.arange(rows.shape[1]) >= lens[..., None], float("-inf"))
    lse = torch.logsumexp(s, -1, keepdim=True)
    return lse, torch.einsum("nrl,nlc->nrc", torch.exp(s - lse), rows[..., :C].double())


@pytest.mark.parametrize("R,L", [(4, 1), (4, 31), (12, 33), (20, 100), (3, 70), (5, 257)])
def test_pieces_equal_an_explicit_softmax(kernel, R, L):
    g = torch.Generator().manual_seed(R * 1000 + L)
    N, W, C = 5, 576, 512
    buf = torch.randn(N, L + 9, W, generator=g)  # a strided view, as the cache is read
    rows, q = buf[:, :L], torch.randn(N, R, W, generator=g) * 0.2
    lens = torch.randint(1, L + 1, (N, R), generator=g)
    lens[0] = L  # one sequence sees every row
    for ln in (lens, lens[:, :1].contiguous(), None):  # per query row, per sequence, all rows
        lse, out = mqa_kernel.attention_pieces(q, rows, ln, C)
        want_lse, want_out = _reference(q, rows, ln, C)
        assert torch.allclose(lse.double(), want_lse, rtol=0, atol=2e-5)
        assert torch.allclose(out.double(), want_out, rtol=0, atol=2e-5)


def test_a_sequence_gets_the_same_bits_alone_or_in_any_batch(kernel):
    g = torch.Generator().manual_seed(7)
    W, C = 576, 512
    rows, q = torch.randn(9, 80, W, generator=g), torch.randn(9, 4, W, generator=g) * 0.2
    lens = torch.randint(1, 60, (9, 1), generator=g)
    lse, out = mqa_kernel.attention_pieces(q, rows, lens, C)
    for i in (0, 4, 8):
        # alone, and with less padding behind its rows (the buffer's length follows the batch's longest)
        a_lse, a_out = mqa_kernel.attention_pieces(q[i:i + 1], rows[i:i + 1, :60], lens[i:i + 1], C)
        if kernel == "qverify":
            assert torch.equal(a_lse, lse[i:i + 1]) and torch.equal(a_out, out[i:i + 1])
        else:  # torch's kernel: blocks over the padded length, so the same only within float tolerance
            assert torch.allclose(a_out, out[i:i + 1], atol=1e-6)


def test_rope_table_and_one_pass_rope_give_transformers_bits():
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
        apply_rotary_pos_emb,
        apply_rotary_pos_emb_interleave,
    )

    from qverify.assets import default_model_dir
    from qverify.serve.embedded.mla import rope_rows, rope_tables
    from qverify.serve.embedded.model_loader import load_for_serving

    rotary = load_for_serving(default_model_dir(), speculative=False).model.model.rotary_emb
    x, cache = torch.zeros(1, 1, 8), {}
    pos = torch.tensor([0, 5, 1999, 3000, 17, 17])  # 3000: past the first table, which then grows
    cos, sin = rope_tables(rotary, pos, x, cache)
    with torch.no_grad():
        want_cos, want_sin = rotary(x, pos[None])
    assert cache["len"] > 3000 and torch.equal(cos[:, 0], want_cos[0]) and torch.equal(sin[:, 0], want_sin[0])
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 4, 6, 64, generator=g), torch.randn(1, 1, 6, 64, generator=g)  # HF: [1, heads, N, rope]
    both = torch.cat([q[0], k[0]]).transpose(0, 1)  # ours: [N, heads + 1, rope]
    for hf, interleave in ((apply_rotary_pos_emb_interleave, True), (apply_rotary_pos_emb, False)):
        want_q, want_k = hf(q, k, want_cos, want_sin)
        got = rope_rows(both, cos, sin, interleave)
        assert torch.equal(got[:, :4], want_q[0].transpose(0, 1)) and torch.equal(got[:, 4], want_k[0, 0])


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: rope_rows is what runs")
@pytest.mark.parametrize("interleave", [True, False])
def test_the_kernels_one_pass_rope_gives_rope_rows_bits(interleave):
    """mqa_kernel.rope_qk (the query heads' and the key's rope parts from the projections, written where the
    engine keeps them) against rope_rows, which the test above holds to transformers' bits."""
    from qverify.serve.embedded.mla import rope_rows

    g = torch.Generator().manual_seed(1)
    N, H, dn, dr, C = 37, 4, 32, 64, 512
    q = torch.randn(N, H * (dn + dr), generator=g).view(N, H, dn + dr)
    kv = torch.randn(N, C + dr, generator=g)
    ang = torch.randn(N, 1, dr, generator=g) * 10
    cos, sin = ang.cos(), ang.sin()
    latent = torch.full((N, C + dr), float("nan"))
    q_rot = mqa_kernel.rope_qk(q, kv, cos, sin, dn, interleave, latent)
    want = rope_rows(torch.cat([q[..., dn:], kv[:, None, C:]], 1), cos, sin, interleave)
    assert torch.equal(q_rot, want[:, :H]) and torch.equal(latent[:, C:], want[:, H])
    assert latent[:, :C].isnan().all()  # the latent's first C values are the caller's to write


def test_rms_norm_into_a_latent_slice_gives_the_modules_bits():
    """mla.rms_norm_into (kv_a_layernorm written straight into the latent buffer's strided slice) against
    transformers' DeepseekV3RMSNorm module, bit for bit, with a trained-looking weight; the rest of the row is
    left alone. A bf16 norm takes the module itself."""
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3RMSNorm

    from qverify.serve.embedded.mla import rms_norm_into

    g = torch.Generator().manual_seed(3)
    norm = DeepseekV3RMSNorm(512, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(512, generator=g) * 2)
        kv = torch.randn(300, 576, generator=g) * torch.rand(300, 1, generator=g) * 5
        latent = torch.full((300, 576), float("nan"))
        rms_norm_into(norm, kv[:, :512], latent[:, :512])
        assert torch.equal(latent[:, :512], norm(kv[:, :512])) and latent[:, 512:].isnan().all()
        half = DeepseekV3RMSNorm(512).to(torch.bfloat16)
        out = torch.empty(300, 512, dtype=torch.bfloat16)
        rms_norm_into(half, kv[:, :512].bfloat16(), out)
        assert torch.equal(out, half(kv[:, :512].bfloat16()))


def test_the_limit_counts_kv_b_proj_once_and_lm_head_where_logits_are_used():
    spec = importlib.util.spec_from_file_location("engine_throughput",
                                                  Path(__file__).parents[2] / "benchmarks" / "engine_throughput.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    from types import SimpleNamespace as NS

    from qverify.assets import default_model_dir
    from qverify.serve.embedded.model_loader import load_for_serving

    model = load_for_serving(default_model_dir(), speculative=False).model
    c = model.config
    H, dn, dv, C, D, V = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank, c.hidden_size, c.vocab_size
    lin = bench.linear_flops_per_token(model)
    assert lin["kv_b"] == 2 * c.num_hidden_layers * H * (dn + dv) * C and lin["lm_head"] == 2 * D * V
    reqs = [NS(prompt_ids=[1, 2, 3], prompt_logprobs=None), NS(prompt_ids=[1, 2, 3], prompt_logprobs=None)]
    res = [NS(token_ids=[7, 8], finish_reason="length"), NS(token_ids=[9], finish_reason="stop")]
    got = bench.workload_flops(model, lin, reqs, res)
    prefill = sum(lin["body"] + lin["kv_b"] + bench.attention_flops(model, i + 1, True) for i in range(3)) + lin["lm_head"]
    decode = sum(lin["body"] + lin["lm_head"] + bench.attention_flops(model, 3 + i + 1, False) for i in (0, 1, 0, 1))
    assert got == pytest.approx(prefill + decode)  # one prefill for the shared prompt, 4 decoded tokens (EOS counts)
    echo = [NS(prompt_ids=[1, 2, 3], prompt_logprobs=5)]
    assert bench.workload_flops(model, lin, echo, [NS(token_ids=[], finish_reason="length")]) == pytest.approx(
        prefill + 2 * lin["lm_head"])  # echo: logits at every prompt position


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: the engine uses torch's kernels")
def test_fused_decode_equals_one_softmax_over_prompt_then_own_rows():
    """The engine's decode attention (mqa_decode): each sequence over its prompt's rows, then its own first
    gen_lens rows, in any order of sequences, equals an explicit softmax over the two concatenated."""
    assert mqa_kernel.load() is not None
    g = torch.Generator().manual_seed(3)
    W, C, B, R = 576, 512, 7, 8
    prompts = [torch.randn(n, W, generator=g) for n in (5, 40, 97)]
    prompt_of = torch.tensor([2, 0, 2, 1, 1, 0, 2])
    gen = torch.randn(B, 50, W, generator=g)
    gen_lens = torch.randint(1, 41, (B, R), generator=g)
    q = torch.randn(B, R, W, generator=g) * 0.2
    order = torch.tensor([1, 5, 3, 4, 0, 2, 6])
    got = mqa_kernel.fused_decode(q, prompts, prompt_of, gen, gen_lens, order, C)
    for b in range(B):
        p = prompts[int(prompt_of[b])]
        rows = torch.cat([p, gen[b]])[None]
        _, want = _reference(q[b:b + 1], rows, (gen_lens[b:b + 1] + len(p)), C)
        assert torch.allclose(got[b:b + 1].double(), want, rtol=0, atol=2e-5)
    alone = mqa_kernel.fused_decode(q[4:5], prompts, prompt_of[4:5], gen[4:5, :41], gen_lens[4:5], torch.tensor([0]), C)
    assert torch.equal(alone, got[4:5])  # the same bits alone, with a shorter buffer, in another order


@pytest.mark.parametrize("n", [1, 63, 64, 65, 130, 300])
def test_prefill_causal_attention_equals_an_explicit_masked_softmax(n):
    """The blocked prefill attention (mla.causal_attention) against float64 with the whole causal mask at once:
    a block boundary off by one (a row seeing its next token, or not its own) moves rows by far more than 1e-5."""
    from qverify.serve.embedded.mla import causal_attention

    g = torch.Generator().manual_seed(n)
    q, k, v = torch.randn(4, n, 96, generator=g), torch.randn(4, n, 96, generator=g), torch.randn(4, n, 32, generator=g)
    s = torch.einsum("hqd,hkd->hqk", q.double(), k.double()) * 0.1
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    ref = torch.einsum("hqk,hkd->hqd", torch.softmax(s, -1), v.double())
    assert (causal_attention(q, k, v, 0.1).double() - ref).abs().max() < 1e-5


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: compressed-tensors' eager cast runs")
def test_the_fp4_cast_backend_gives_compressed_tensors_values():
    """qverify's cast_to_fp4 (registered with compressed-tensors for fp32 CPU tensors) against compressed-tensors'
    eager function, bit for bit: random values over the FP4 range and past it, every interval bound, each side of
    it, signed zeros, infinities; NaN stays NaN."""
    from compressed_tensors.quantization.utils.fp4_utils import cast_to_fp4
    from compressed_tensors.utils.impl_backend import ImplBackend

    from qverify.serve.embedded.ct_forward import register_cpu_fp4_cast

    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    edges = torch.cat([bounds, bounds.nextafter(torch.tensor(0.0)), bounds.nextafter(torch.tensor(9.0)),
                       torch.tensor([0.0, -0.0, 6.0, 7.5, float("inf")])])
    x = torch.cat([torch.randn(4987, generator=torch.Generator().manual_seed(0)) * 3, edges, -edges,
                   torch.tensor([float("nan")])]).view(-1, 8)
    want = ImplBackend.call("cast_to_fp4", x)  # the eager function, by its registered name
    register_cpu_fp4_cast()
    got = cast_to_fp4(x)  # the dispatch wrapper, which now picks qverify's backend
    assert got.shape == x.shape and got[-1, -1].isnan()
    assert torch.equal(got.view(torch.int32)[~want.isnan()], want.view(torch.int32)[~want.isnan()])
    assert torch.equal(mqa_kernel.load().cast_to_fp4(x).view(torch.int32), got.view(torch.int32))  # it was the one used


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: the torch ops run")
def test_the_fp8_latent_roundtrip_kernel_gives_the_torch_ops_values():
    """kv_fp8.fp8_roundtrip's one-pass kernel against its five torch ops (x / scale, clamp, float8_e4m3fn, back,
    * scale) bit for bit, on a strided view with per-value scales, values past the FP8 range and NaN."""
    from qverify.quantize.kv_scales import FP8_E4M3_MAX
    from qverify.serve.embedded.kv_fp8 import fp8_roundtrip

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(50, 600, generator=g) * torch.logspace(-4, 3, 600)[None])[:, :576]  # row stride 600
    x[0, :3] = torch.tensor([float("nan"), 1e9, -1e9])
    scale = torch.rand(576, generator=g) * 0.2 + 0.01
    want = (x / scale).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(torch.float8_e4m3fn).to(torch.float32) * scale
    got = fp8_roundtrip(x, scale)
    assert mqa_kernel.load() is not None and got[0, 0].isnan()
    ok = ~want.isnan()
    assert torch.equal(got.view(torch.int32)[ok], want.view(torch.int32)[ok])


@pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: the torch form runs")
def test_the_kernels_gumbel_argmax_is_the_samplers_torch_form():
    """The kernel's Gumbel-max (counter hash per (seed, step, token id), -log(-log u)) against the sampler's torch
    form (uniform_noise, _gumbel, argmax) on 2,000 rows: whole-vocabulary rows and candidate rows with their token
    ids and masked columns, seeds past 2^32 and negative ones."""
    from qverify.serve.embedded.sampler import _gumbel, uniform_noise

    g = torch.Generator().manual_seed(4)
    R, V, K = 1000, 768, 64
    z = torch.randn(R, V, generator=g) * 0.5  # flat rows: the noise decides, so any hash slip changes the winner
    seeds = torch.randint(-2**40, 2**40, (R,), generator=g)
    steps = torch.randint(0, 5000, (R,), generator=g)
    want = (z.double() + _gumbel(uniform_noise(seeds, steps, V))).argmax(-1)
    assert torch.equal(mqa_kernel.load().gumbel_argmax(z, seeds, steps, torch.empty(0, dtype=torch.long)), want)
    ids = torch.stack([torch.randperm(V, generator=g)[:K] for _ in range(R)])
    zk = z.gather(1, ids).masked_fill(torch.rand(R, K, generator=g) < 0.3, float("-inf"))
    want = (zk.double() + _gumbel(uniform_noise(seeds, steps, ids))).argmax(-1)
    assert torch.equal(mqa_kernel.load().gumbel_argmax(zk, seeds, steps, ids), want)


def _masked_softmax_reference(q, k, v, scale):
    """Causal attention in float64 with the whole mask at once, [H, n, dv]."""
    n = q.shape[1]
    s = torch.einsum("hqd,hkd->hqk", q.double(), k.double()) * scale
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hqk,hkd->hqd", torch.softmax(s, -1), v.double())


def _qkv(n, seed, d=96, dv=32, H=4):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(H, n, d, generator=g), torch.randn(H, n, d, generator=g) * 2, torch.randn(H, n, dv, generator=g))


needs_kernel = pytest.mark.skipif(not HAS_COMPILER, reason="no C++ compiler / ninja here: the torch code runs")


@needs_kernel
@pytest.mark.parametrize("n", [1, 7, 8, 9, 31, 32, 33, 64, 300])
def test_prefill_kernel_equals_an_explicit_masked_softmax(n):
    """The prefill kernel (prefill_kernel.cpp) at partial query tiles (8 rows) and key blocks (32 keys), against
    float64; and mla.causal_attention really runs it (bit-equal to the direct call)."""
    from qverify.serve.embedded.mla import causal_attention

    q, k, v = _qkv(n, n)
    got = mqa_kernel.causal_prefill(q, k, v, 0.1)
    assert got is not None and got.shape == (n, 4, 32)
    assert (got.transpose(0, 1).double() - _masked_softmax_reference(q, k, v, 0.1)).abs().max() < 1e-5
    assert torch.equal(causal_attention(q, k, v, 0.1), got.transpose(0, 1))


@needs_kernel
def test_prefill_kernel_reads_strided_and_split_inputs():
    """Views as MLALayer.prefill has them: heads-second projections transposed, the query and key each in two parts
    along d (the key's second part a stride-0 expand over heads), v a slice of a wider row; equal to the
    contiguous, concatenated inputs bit for bit, and to float64."""
    n, H = 77, 4
    g = torch.Generator().manual_seed(5)
    qn, qr = torch.randn(n, H, 32, generator=g), torch.randn(n, H, 64, generator=g)
    kv = torch.randn(n, H, 32 + 32, generator=g)
    kr = torch.randn(n, 1, 64, generator=g)
    q = torch.cat([qn, qr], -1).transpose(0, 1).contiguous()
    k = torch.cat([kv[..., :32], kr.expand(n, H, 64)], -1).transpose(0, 1).contiguous()
    v = kv[..., 32:].transpose(0, 1)  # [H, n, 32], row stride 64 * H
    want = mqa_kernel.causal_prefill(q, k, v.contiguous(), 0.2)
    got = mqa_kernel.causal_prefill(qn.transpose(0, 1), k[..., :32].transpose(1, 2).contiguous().transpose(1, 2), v, 0.2,
                                    q2=qr.transpose(0, 1), k2=kr.transpose(0, 1).expand(H, n, 64))
    assert torch.equal(got, want)
    assert (got.transpose(0, 1).double() - _masked_softmax_reference(q, k, v, 0.2)).abs().max() < 1e-5


@needs_kernel
@pytest.mark.parametrize("n", [45, 300])
def test_prefill_kernel_prefix_rows_do_not_depend_on_later_rows(n):
    """Causality, bit for bit: the first m rows' outputs are what the first m rows alone give (later keys, however
    large, never enter; a partial last tile or block computes its rows as a full one does)."""
    q, k, v = _qkv(n, 11)
    k[:, n // 2:] *= 1e3  # later keys that would dominate any row that saw them
    full = mqa_kernel.causal_prefill(q, k, v, 0.1)
    for m in (1, 8, 13, n // 2, n - 1):
        assert torch.equal(mqa_kernel.causal_prefill(q[:, :m], k[:, :m], v[:, :m], 0.1), full[:m]), m


@needs_kernel
def test_prefill_kernel_gives_the_same_bits_on_two_threads():
    q, k, v = _qkv(200, 3)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = mqa_kernel.causal_prefill(q, k, v, 0.1)
        torch.set_num_threads(2)
        two = mqa_kernel.causal_prefill(q, k, v, 0.1)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_prefill_half_precision_is_computed_in_fp32():
    """bf16 inputs: computed in fp32 (the kernel where built), the result cast back: equal to the fp32 result of the
    same (bf16-rounded) inputs, cast."""
    from qverify.serve.embedded.mla import causal_attention

    q, k, v = (t.bfloat16() for t in _qkv(70, 2))
    got = causal_attention(q, k, v, 0.1)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, causal_attention(q.float(), k.float(), v.float(), 0.1).bfloat16())
    assert (got.double() - _masked_softmax_reference(q, k, v, 0.1)).abs().max() < 2e-2


@pytest.mark.parametrize("n", [1, 63, 64, 65, 130])
def test_prefill_falls_back_to_the_torch_code_without_the_kernel(monkeypatch, n):
    """Without the kernel (no compiler, QVERIFY_MQA_KERNEL=0) the blocked torch code runs: at its 64-row block
    boundaries against float64 (the test above, where the kernel is built, checks the kernel)."""
    from qverify.serve.embedded.mla import causal_attention

    monkeypatch.setitem(mqa_kernel._STATE, "ext", None)
    q, k, v = _qkv(n, 4)
    assert mqa_kernel.causal_prefill(q, k, v, 0.1) is None
    assert (causal_attention(q, k, v, 0.1).double() - _masked_softmax_reference(q, k, v, 0.1)).abs().max() < 1e-5
