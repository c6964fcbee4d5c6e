"""The planner's KV pool against SGLang 0.5.23's own sizing code, cut from its source (tests/sglang_ref/pool_source.py)
and run on the same memory figures."""

from __future__ import annotations

import pytest

from qverify.capacity import plan
from qverify.capacity import sglang_pool as sp
from qverify.capacity.gpus import GIB
from qverify.capacity.sources import load_config
from tests.sglang_ref import pool_source as ref

KIMI_FP8_CELL = 61 * 576 * 1  # 61 MLA layers x (512 latent + 64 rope) x 1 B


def sglang_tokens(p, draft_layers: int = 0) -> int:
    """max_total_num_tokens SGLang computes from the plan's own pre-load and after-load memory figures."""
    pre_gib = p.pre_model_load_bytes / GIB
    after_load_gib = (p.pre_model_load_bytes - p.weights_per_gpu_bytes - p.mla_copies_per_gpu_bytes) / GIB
    budget = ref.profile_available_bytes(available_gib=after_load_gib, pre_model_load_gib=pre_gib,
                                         mem_fraction_static=p.mem_fraction, multimodal=True)
    layers = 61
    cell = ref.mla_cell_size(kv_lora_rank=512, qk_rope_head_dim=64, layers=layers, kv_bytes=1)
    if draft_layers:
        cell += ref.eagle_draft_cell(cell, draft_layers, layers)
    return ref.calculate_pool_tokens(budget, cell)


@pytest.mark.parametrize("multimodal", [False, True])
@pytest.mark.parametrize(("pre_gib", "weights_gb", "fraction"), [(176.56, 150.0, 0.85), (140.2, 40.0, 0.7), (79.0, 20.0, 0.9)])
def test_pool_bytes_is_sglangs_profile_available_bytes(pre_gib, weights_gb, fraction, multimodal):
    pre, weights = int(pre_gib * GIB), int(weights_gb * 1e9)
    theirs = ref.profile_available_bytes(available_gib=(pre - weights) / GIB, pre_model_load_gib=pre / GIB,
                                         mem_fraction_static=fraction, multimodal=multimodal)
    assert abs(sp.pool_bytes(pre, weights, fraction, multimodal) - theirs) <= 1  # float GiB rounding only


@pytest.mark.parametrize(("draft_layers", "layers"), [(0, 61), (1, 61), (1, 3), (2, 27)])
def test_cell_with_drafter_is_sglangs(draft_layers, layers):
    cell = ref.mla_cell_size(kv_lora_rank=512, qk_rope_head_dim=64, layers=layers, kv_bytes=2)
    theirs = cell + (ref.eagle_draft_cell(cell, draft_layers, layers) if draft_layers else 0)
    assert sp.cell_bytes(cell, layers, draft_layers) == theirs


@pytest.fixture(scope="module")
def kimi():
    return load_config("kimi-k2.6")[0]


def test_kimi_b200_tp4_at_the_profiles_085_is_sglangs_count(kimi):
    p = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85)
    assert p.kv_tokens_per_replica == sglang_tokens(p)
    # the estimate: 0.29-0.35M FP8 tokens per replica, about 3 sessions of 100k (docs said 0.966M and 9)
    assert 290_000 <= p.kv_tokens_per_replica <= 350_000 and p.sessions_at_context == 3
    assert p.slack_bytes == int(p.pre_model_load_bytes * 0.15)
    assert p.cuda_context_bytes == int(2.5 * GIB)


def test_tp_replicated_modules_are_counted_whole_on_every_rank(kimi):
    p = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85)
    fused_qkv_a = 61 * (1536 + 512 + 64) * 7168 * 2  # bf16 ReplicatedLinear per layer
    router = 60 * 384 * (7168 * 2 + 4)  # MoEGate weight + fp32 correction bias, 60 MoE layers
    assert p.replicated_extra_per_gpu_bytes > (fused_qkv_a + router) * 3 // 4  # plus norms and the vision tower's MLPs
    assert 1.6e9 < (fused_qkv_a + router) * 3 / 4 < 1.7e9  # the "about +1.6 GB per GPU"
    even = (p.weights.total_bytes) // 4
    assert p.weights_per_gpu_bytes == even + p.replicated_extra_per_gpu_bytes
    assert p.weights.bytes_by_class["vision"] == pytest.approx(0.94e9, rel=0.01)


def test_an_eagle3_head_adds_its_weights_and_one_layer_of_kv(kimi):
    head = {"architectures": ["Eagle3DeepseekV2ForCausalLM"], "hidden_size": 7168, "intermediate_size": 18432,
            "num_hidden_layers": 1, "num_attention_heads": 64, "kv_lora_rank": 512, "q_lora_rank": 1536,
            "qk_rope_head_dim": 64, "qk_nope_head_dim": 128, "v_head_dim": 128, "vocab_size": 163840,
            "draft_vocab_size": 32000, "tie_word_embeddings": False}
    bare = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85)
    with_head = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85, drafter_config=head)
    fp8 = next(o for o in with_head.kv if o.kv_dtype == "fp8")
    assert fp8.rank_bytes_per_token == KIMI_FP8_CELL + KIMI_FP8_CELL // 61  # SGLang: the target's per-layer KV
    assert with_head.kv_tokens_per_replica == sglang_tokens(with_head, draft_layers=1)
    assert with_head.weights_per_gpu_bytes > bare.weights_per_gpu_bytes + with_head.drafter_weights_bytes // 4
    assert with_head.kv_tokens_per_replica < bare.kv_tokens_per_replica


def test_the_reports_projection_uses_the_production_profiles_fraction():
    """The review report's "sessions at 100k" comes from the kimi-k2.6 profile's mem_fraction_static (0.85)."""
    from types import SimpleNamespace

    from qverify.reports.facts import BuildFacts, _project

    rows = [BuildFacts(build_id="b", recipe="fp8kv_nvfp4shared", weights_bytes=None, kv_dtype=None, kv_bytes_per_token=None)]
    _project(SimpleNamespace(gate=SimpleNamespace(config={"capacity": {"tp": 4}})), rows)
    assert rows[0].projection["tp"] == 4 and rows[0].projection["sessions"] == 3
    assert 290_000 <= rows[0].projection["kv_tokens_per_replica"] <= 350_000
    # the report's weights per GPU is capacity's (issue 40.6: it divided the total by TP, missing what TP replicates)
    p = plan(load_config("kimi-k2.6")[0], "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85)
    assert rows[0].projection["weights_per_gpu_bytes"] == p.weights_per_gpu_bytes
    from qverify.reports.formatting import fmt_bytes
    from qverify.reports.rows import projection

    shown = projection(SimpleNamespace(facts=rows))[1][0][2]
    assert shown == fmt_bytes(p.weights_per_gpu_bytes)
