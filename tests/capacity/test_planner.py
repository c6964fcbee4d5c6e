"""The planner against the published Kimi K2.6 figures and hand-computed GQA math.

The Kimi K2.6 article's arithmetic: all 180 GB of a B200, no activation reserve, 595 GB
of weights split evenly over TP, BF16 MLA KV = 61 x 576 x 2 B per token. The planner sizes
the pool as SGLang does (tests/capacity/test_sglang_pool.py); the article's arithmetic lives
in its notes (qverify/capacity/published.py).
"""

from __future__ import annotations

import pytest

from qverify.capacity import kv_bytes_per_token, kv_layout, plan
from qverify.capacity.published import article_tokens
from qverify.capacity.sources import load_config
from qverify.errors import BadInput

GB = 1e9
ARTICLE = {"gpu": "b200", "hbm_gb": 180, "mem_fraction": 1.0, "cuda_context_gb": 0.0, "weights_gb": 595}


@pytest.fixture(scope="module")
def kimi() -> dict:
    """The K2.6 text config unquantized (these tests price recipes from bf16); the release's own INT4 experts are
    tested in test_kimi_as_shipped_prices_int4_experts."""
    return {k: v for k, v in load_config("kimi-k2.6")[0].items() if k != "quantization_config"}


def test_kimi_as_shipped_prices_int4_experts():
    shipped = load_config("kimi-k2.6")[0]
    p = plan(shipped, "fp8kv_nvfp4shared", tp=4, gpu="b200")
    assert p.weights.schemes["routed_experts"] == "int4_g32" and p.weights.schemes["shared_experts"] == "nvfp4"
    assert p.hbm_bytes == 183_359 * 2**20  # what a B200 reports, not the 180 GB spec figure
    assert 585e9 < p.weights.total_bytes < 595e9
    # SGLang's own default for this model on a B200 (about 0.77 with the vision tower) leaves no pool (issue 36.2:
    # the 10 GiB floor's 0.944 gave 822,417 tokens); tests/capacity/test_sglang_default.py has the rule
    assert not p.fits and p.kv_tokens_per_replica == 0 and 0.76 < p.mem_fraction < 0.78


def test_kimi_kv_bytes_per_token(kimi):
    assert kv_bytes_per_token(kimi, "bf16") == 61 * 576 * 2 == 70_272
    assert kv_bytes_per_token(kimi, "fp8") == 70_272 // 2
    layout = kv_layout(kimi)
    assert layout.kind == "mla" and layout.rank_bytes_per_token("bf16", 8) == 70_272  # whole latent on every rank


def test_kimi_tp4_on_b200_article_arithmetic(kimi):
    free, bf16 = article_tokens(kimi, 4, "bf16")
    assert free / GB == pytest.approx(31.25)  # the article's "31.3 GB"
    assert bf16 == 31.25e9 / 70_272 and bf16 / 1e6 == pytest.approx(0.445, abs=0.001)
    assert article_tokens(kimi, 4, "fp8")[1] / 1e6 == pytest.approx(0.89, abs=0.005)
    # the same inputs through SGLang's sizing (fraction 1, no CUDA context): TP-replicated modules take ~2.1 GB more,
    # the w_kc/w_vc copies of kv_b_proj 61 x 16 heads x 512 x 256 x 2 B = 0.26 GB
    p = plan(kimi, "nvfp4_experts", tp=4, **ARTICLE)
    assert p.mla_copies_per_gpu_bytes == 61 * 16 * 512 * 256 * 2
    assert 28.6e9 < p.free_per_gpu_bytes < 28.9e9 and p.kv_tokens_per_replica == p.free_per_gpu_bytes // 70_272
    assert p.sessions_at_context == 4


def test_kimi_tp8_fp8_is_the_articles_3m(kimi):
    free, fp8 = article_tokens(kimi, 8, "fp8")
    assert free / GB == pytest.approx(105.625) and fp8 / 1e6 == pytest.approx(3.0, abs=0.01)
    assert article_tokens(kimi, 8, "bf16")[1] / 1e6 == pytest.approx(1.5, abs=0.01)
    p = plan(kimi, "fp8kv_nvfp4_experts", tp=8, **ARTICLE)
    assert p.kv_dtype == "fp8" and p.kv_tokens_per_replica / 1e6 == pytest.approx(2.93, abs=0.01)
    notes = " ".join(p.notes)
    assert "'TP8: 3.0M tokens, 6x TP4' matches the FP8-KV figure (3.01M), not BF16 (1.50M)" in notes
    assert "DP-attention off" in " ".join(p.assumptions)


def test_kimi_weights_from_config_match_published_595gb(kimi):
    est = plan(kimi, "nvfp4_experts", tp=4, gpu="b200").weights
    assert est.source == "config+recipe"
    assert est.total_params / 1e12 == pytest.approx(1.026, abs=0.001)  # "1T parameters"
    assert est.total_bytes / GB == pytest.approx(595, rel=0.005)
    # routed experts: 4 bits + an FP8 scale per 16 weights = 4.5 bits, plus 2 fp32 global scales per Linear
    assert est.bytes_by_class["routed_experts"] == pytest.approx(est.params_by_class["routed_experts"] * 4.5 / 8, rel=1e-6)
    bf16 = plan(kimi, "bf16", tp=4, gpu="b200").weights.total_bytes
    assert bf16 / GB == pytest.approx(2 * est.total_params / GB, rel=1e-3)
    # Moonshot's INT4 group-32 (bf16 scales) costs the same 4.5 bits a weight
    assert plan(kimi, "int4_experts", tp=4, gpu="b200").weights.total_bytes / GB == pytest.approx(est.total_bytes / GB, rel=1e-4)


def test_default_fraction_is_sglangs_and_a_given_one_is_used(kimi):
    p = plan(kimi, "nvfp4_experts", tp=4, gpu="b200", weights_gb=595)
    assert p.mem_fraction_source.startswith("SGLang's default")
    q = plan(kimi, "nvfp4_experts", tp=4, gpu="b200", weights_gb=595, mem_fraction=0.85)
    assert q.mem_fraction == 0.85 and q.mem_fraction_source == "given"
    # only the slack moves: pre-load free x (0.85 - the default)
    assert abs((q.free_per_gpu_bytes - p.free_per_gpu_bytes) - p.pre_model_load_bytes * (0.85 - p.mem_fraction)) < 2


def test_does_not_fit_says_which_tp_would(kimi):
    p = plan(kimi, "bf16", tp=4, gpu="h100", hbm_gb=80)
    assert not p.fits and p.kv_tokens_per_replica == 0
    # SGLang's default on an 80 GB card (about 0.72) leaves less than the old floor's 0.87
    assert any("Does not fit" in n and "TP 64 would fit" in n and "--mem-fraction-static" not in n for n in p.notes)


LLAMA_8B = {  # Llama-3-8B's shape: GQA with 8 KV heads of 128
    "model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
    "max_position_embeddings": 131072,
}


def test_gqa_kv_math_and_tp_sharding():
    assert kv_bytes_per_token(LLAMA_8B, "bf16") == 2 * 32 * 8 * 128 * 2 == 131_072
    layout = kv_layout(LLAMA_8B)
    assert layout.rank_bytes_per_token("bf16", 4) == 131_072 // 4  # 2 KV heads per rank
    assert layout.rank_bytes_per_token("bf16", 16) == 131_072 // 8  # tp > kv_heads: one replicated head each
    p = plan(LLAMA_8B, "fp8kv", gpu="h100", hbm_gb=80, tp=2, mem_fraction=1.0, cuda_context_gb=0, context=8192)
    # 8.03B params in bf16 (Llama-3-8B)
    assert p.weights.total_params == 8_030_261_248 and p.weights.total_bytes == 2 * 8_030_261_248
    norms = 2 * 4096 * (2 * 32 + 1)  # replicated on both ranks: the second copy is the only extra
    free = 80e9 - 8_030_261_248 - (norms - norms // 2)
    assert p.free_per_gpu_bytes == free
    assert p.kv_tokens_per_replica == int(free // (32 * 4 * 128 * 2 * 1))
    assert p.sessions_at_context == p.kv_tokens_per_replica // 8192
    assert not any("MLA" in n for n in p.notes) and not any("Kimi" in n for n in p.notes)


def test_hbm_override_and_bad_inputs(kimi):
    assert plan(kimi, "bf16", gpu="mi300x", hbm_gb=192, tp=8).hbm_bytes == 192 * 10**9
    with pytest.raises(BadInput, match="did you mean 'h200'"):
        plan(kimi, gpu="h20O")
    for kwargs in ({"tp": 0}, {"mem_fraction": 1.5}, {"context": 0}, {"weights_gb": -1}):
        with pytest.raises(BadInput):
            plan(kimi, **kwargs)
    with pytest.raises(BadInput, match="no 'num_hidden_layers'"):
        plan({"hidden_size": 8, "vocab_size": 8})


def test_shipped_production_recipe_on_kimi(kimi):
    # The seeds' headline on the full-size model: NVFP4 shared experts free HBM, FP8 KV doubles tokens.
    base = plan(kimi, "bf16", gpu="b200", tp=16)  # 2 TB of BF16 weights need 16 B200s
    cand = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=16)
    shared = base.weights.params_by_class["shared_experts"]
    linears = 3 * 60  # gate/up/down in each of the 60 MoE layers, each with two fp32 global scales
    assert base.weights.total_bytes - cand.weights.total_bytes == shared * 2 - (shared * 9 // 16 + 8 * linears)
    assert cand.kv_dtype == "fp8" and cand.weights.schemes["shared_experts"] == "nvfp4"
    assert cand.kv_tokens_per_replica > 2 * base.kv_tokens_per_replica
