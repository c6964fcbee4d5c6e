"""SGLang 0.5.23's default --mem-fraction-static by its own rule for the model and the launch flags (issue 36.2), at
production-sized reserves: the old planner took the 10 GiB floor (0.944 on a B200) and printed 822,417 tokens for
Kimi K2.6 on TP4, where SGLang resolves about 0.77 and does not start."""

from __future__ import annotations

import pytest

from qverify.capacity import plan
from qverify.capacity.gpus import gpu
from qverify.capacity.sglang_default import Launch, default_fraction, vlm_factor
from qverify.capacity.sources import load_config

B200 = gpu("b200").hbm_bytes  # 183,359 MiB, as the GPU reports


@pytest.fixture(scope="module")
def kimi() -> dict:
    return load_config("kimi-k2.6")[0]


def test_the_vlm_factor_is_sglangs_own_function(kimi):
    """adjust_mem_fraction_for_vlm imported from SGLang's installed source and run on Kimi's vision tower."""
    from types import SimpleNamespace

    from sglang.srt.arg_groups.memory_hook import adjust_mem_fraction_for_vlm

    for vision in (kimi["vision_config"], {"num_hidden_layers": 24, "hidden_size": 1024}, {"num_hidden_layers": 48,
                                                                                           "hidden_size": 1664}):
        mc = SimpleNamespace(hf_config=SimpleNamespace(vision_config=SimpleNamespace(**vision)))
        theirs = adjust_mem_fraction_for_vlm(0.846, mc, False, 183_359)
        assert 0.846 * vlm_factor({"vision_config": vision}) == pytest.approx(theirs, abs=1e-12)
    assert vlm_factor(kimi) == pytest.approx(0.9097, abs=1e-4)  # MoonViT: 27 layers of 1152


def test_kimi_k25_on_b200_tp4_reserves_chunked_prefill_graphs_and_tp(kimi):
    """memory_hook.py:308-315 by hand: 512 + 16,384 x 1.5 + 4/8 x 1024 + 512 x 2 (decode graph) + 1536 (MLA prefill
    graph, kept: KimiK25 is on the breakable allowlist) = 28,160 MiB, well above the 10 GiB floor."""
    d = default_fraction(B200, kimi, Launch(tp=4))
    assert d.reserved_mib == 512 + 16_384 * 1.5 + 512 + 1024 + 1536 == 28_160
    assert d.fraction == pytest.approx(round((183_359 - 28_160) / 183_359, 3) * vlm_factor(kimi))
    assert 0.76 < d.fraction < 0.78  # the field notes' 0.77-0.78
    text = {k: v for k, v in kimi.items() if k not in ("vision_config", "architectures")} | {
        "architectures": ["DeepseekV3ForCausalLM"]}
    # a flat DeepSeek-V3 on trtllm_mla (SGLang's SM100 default) loses its prefill graph, and no vision scaling
    assert default_fraction(B200, text, Launch(tp=4)).fraction == round((183_359 - 26_624) / 183_359, 3) == 0.855
    # the flags move it: a smaller chunked prefill and fewer decode graphs, down to the floor
    small = default_fraction(B200, text, Launch.from_flags(1, {"extra_args": ["--chunked-prefill-size", "2048",
                                                                              "--cuda-graph-max-bs-decode", "8"]}))
    assert small.reserved_mib == 10 * 1024 and small.fraction == round((183_359 - 10_240) / 183_359, 3)


def test_kimi_with_no_profile_does_not_fit_and_says_from_which_fraction(kimi):
    """The docs' command without a profile: SGLang's default leaves no pool, and the plan says so with the
    fraction that would fit; at the profile's 0.85 the margin is printed beside the figure."""
    p = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4)
    assert not p.fits and p.kv_tokens_per_replica == 0
    assert 0.78 < p.margin.fits_from_fraction < 0.80 < p.margin.one_session_from_fraction < 0.82
    assert any(n.startswith("Does not fit") and f"--mem-fraction-static {p.margin.fits_from_fraction:g}" in n
               for n in p.notes)
    q = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85)
    assert q.sessions_at_context == 3 and q.margin.spare_tokens == q.kv_tokens_per_replica - 300_000
    assert 25_000 < q.margin.tokens_per_gib_context < 27_000  # the "about 26k tokens per extra GiB"
    # exactly what one more GiB of CUDA context does to the figure
    r = plan(kimi, "fp8kv_nvfp4shared", gpu="b200", tp=4, mem_fraction=0.85, cuda_context_gb=2.5 * 2**30 / 1e9 + 2**30 / 1e9)
    assert abs((q.kv_tokens_per_replica - r.kv_tokens_per_replica) - q.margin.tokens_per_gib_context) <= 1


@pytest.mark.parametrize("flags", [{}, {"extra_args": ["--chunked-prefill-size", "2048", "--cuda-graph-max-bs-decode", "8"]},
                                   {"extra_args": ["--disable-cuda-graph"]}, {"extra_args": ["--chunked-prefill-size=32768"]}])
@pytest.mark.parametrize("name", ["b200", "h200", "h100"])
def test_the_floor_and_rounding_are_sglangs_own_statements(kimi, flags, name):
    """The last two steps (the >60 GiB floor, round((total - reserved) / total, 3)) run as SGLang's own statements,
    cut from memory_hook.py (tests/sglang_ref/pool_source.py), on this planner's reserve."""
    from tests.sglang_ref import pool_source as ref

    mib = gpu(name).hbm_bytes / 2**20
    d = default_fraction(gpu(name).hbm_bytes, kimi, Launch.from_flags(4, flags))
    assert d.fraction == pytest.approx(ref.default_mem_fraction(mib, d.reserved_mib) * d.vlm_factor, abs=1e-12)
