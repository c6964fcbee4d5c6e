"""A production build must never hold the routed experts dequantized, said in a form that does not depend on the
machine: the peak RSS's growth from a 4x16 to an 8x32 kimi_k25 checkpoint (layers x experts, hidden 512, grown shard
by shard), per added byte of routed experts in bf16 (`benchmarks.build_memory.growth_ratio`). Each build runs in a
fresh process; its peak is VmHWM above the RSS after the libraries are imported, so the libraries', the allocator's
and BLAS's own footprint cancels, and so does what both sizes share.

Measured (2026-12-04, the shared 2-core box, one build per code, recipe and size): `benchmarks/build_memory.py --sizes
4x16,8x32 --old-sizes 4x16,8x32` gives 0.28x for this code (fp8kv_nvfp4shared; as_shipped 0.02x) and 1.93x for the
code before the layer-by-layer build (git `0070da0^`, which dequantizes every expert at once, on a flat copy of the
same weights; as_shipped 2.59x). This test on that code (`QVERIFY_BUILD_MEMORY_REF=0070da0^ pytest
tests/quantize/test_build_memory.py`) fails with 3.26x (252 -> 1112 MiB above base); on this code it measures
0.23x and 0.29x (two runs: 143 -> 204, 135 -> 212 MiB). The bound, 1.0x, sits between.
Absolute figures (peak MiB, seconds) are reported by benchmarks/build_memory.py, never asserted.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two builds in fresh processes: 25 s idle, 2 min on a busy box

ROOT = Path(__file__).resolve().parents[2]
SMALL, LARGE, HIDDEN = "4x16", "8x32", 512
RECIPE = "fp8kv_nvfp4shared"  # calibrates: the path where experts could be dequantized
BOUND = 1.0  # peak growth per added routed bf16 byte; a build holding the experts dequantized needs >= 1 by itself


@pytest.fixture(scope="session")
def grown(request, tmp_path_factory):
    from benchmarks.build_memory import grown_checkpoint

    cache = getattr(request.config, "cache", None)
    root = cache.mkdir("kimi_k25") if cache is not None else tmp_path_factory.mktemp("k25g")
    return {spec: grown_checkpoint(root, spec, HIDDEN) for spec in (SMALL, LARGE)}


def test_build_peak_grows_far_less_than_the_routed_experts_in_bf16(grown, tmp_path):
    from benchmarks.build_memory import _params, code_at, flat_copy, growth_ratio, run_build

    ref = os.environ.get("QVERIFY_BUILD_MEMORY_REF")  # old code (reads flat checkpoints only): must fail
    code = code_at(tmp_path, ref) if ref else ROOT
    results, routed = {}, {}
    for spec, src in grown.items():
        model = flat_copy(src, tmp_path / f"flat-{spec}") if ref else src
        results[spec] = run_build(RECIPE, model, code, tmp_path)
        assert results[spec]["ok"], results[spec].get("error")
        routed[spec] = _params(src)[1]
    g = growth_ratio(results[SMALL], results[LARGE], routed[SMALL], routed[LARGE])
    mib = {s: r["peak_above_base"] >> 20 for s, r in results.items()}
    print(f"peak grows {g:.2f}x the added routed bf16 bytes (MiB above base: {mib})")  # shown by pytest -rP
    assert g < BOUND, f"peak grows {g:.2f}x the added routed bf16 bytes (MiB above base: {mib})"
