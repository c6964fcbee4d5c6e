"""Causal prefill attention, single-threaded: mla.causal_attention's torch code (blocked GEMMs) against qverify's
prefill kernel (prefill_kernel.cpp, via mqa_kernel.causal_prefill), side by side in one run, at qverify-tiny's
shapes (4 heads, qk 32 + 64, v 32), with the GEMM peak (engine_throughput.py's measure) for reference.

    PYTHONPATH=. .venv/bin/python benchmarks/prefill_attention.py [--n 64,300,1000,2000] [--reps 7]

Times are the best of --reps calls, torch code and kernel interleaved (the box is shared: a neighbour's load lowers
both alike). GFLOP/s count the useful FLOPs only: per head sum over rows i of (i + 1) keys x 2 (d + dv).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="64,300,1000,2000")
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from qverify.serve.embedded import mla, mqa_kernel

    spec = importlib.util.spec_from_file_location("engine_throughput", Path(__file__).with_name("engine_throughput.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    if mqa_kernel.load() is None:
        raise SystemExit("the kernel is not built here (QVERIFY_MQA_KERNEL=0, no compiler or no AVX2)")
    H, dn, dr, dv = 4, 32, 64, 32
    # engine_throughput's GEMM peak at qverify-tiny's shapes (hidden 128; intermediate, 4 x 96, 576, vocab)
    peak = bench.gemm_flops_per_s([(256, 128, n) for n in (512, 384, 576, 4096)])

    def torch_code(q, k, v):
        mqa_kernel._STATE["prefill"] = False  # what QVERIFY_PREFILL_KERNEL=0 sets: causal_attention's torch code
        try:
            return mla.causal_attention(q, k, v, 0.1)
        finally:
            mqa_kernel._STATE["prefill"] = True

    print(f"1 thread; lanes {mqa_kernel._STATE['lanes']}; load average {os.getloadavg()[0]:.2f}; "
          f"GEMM peak {peak / 1e9:.1f} GFLOP/s")
    print(f"{'n':>5s} {'torch ms':>9s} {'GFLOP/s':>8s} {'kernel ms':>10s} {'GFLOP/s':>8s} {'speedup':>8s} "
          f"{'kernel/peak':>11s}")
    for n in (int(x) for x in args.n.split(",")):
        g = torch.Generator().manual_seed(n)
        q, k, v = torch.randn(H, n, dn + dr, generator=g), torch.randn(H, n, dn + dr, generator=g), torch.randn(H, n, dv, generator=g)
        flops = H * n * (n + 1) / 2 * 2 * (dn + dr + dv)
        best = {"torch": float("inf"), "kernel": float("inf")}
        for _ in range(args.reps):
            for name, f in (("torch", lambda: torch_code(q, k, v)), ("kernel", lambda: mla.causal_attention(q, k, v, 0.1))):
                t0 = time.perf_counter()
                f()
                best[name] = min(best[name], time.perf_counter() - t0)
        t, kt = best["torch"], best["kernel"]
        print(f"{n:5d} {t * 1e3:9.3f} {flops / t / 1e9:8.1f} {kt * 1e3:10.3f} {flops / kt / 1e9:8.1f} {t / kt:7.2f}x "
              f"{flops / kt / peak:10.0%}")
    print(f"load average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
