"""compressed-tensors' forward, prepared for serving: the same numerics without per-call work that serving never needs.

A build loaded through compressed-tensors comes back with offload wrappers (its `OffloadCache` / dispatch): every
module call "onloads" its parameters with `Tensor.to`, a no-op on a CPU-only server that cost ~10% of a candidate
build's engine time (profile of `benchmarks/engine_throughput.py --model <fp8kv_nvfp4shared build>`: `send_tensors`
and 50k `Tensor.to` calls). `remove_dispatch(onload_tensors=True)` is compressed-tensors' own way to drop them; the
quantized forward (`set_forward_quantized`: input fake quant per call; a loaded build's weights are already
decompressed, status DECOMPRESSED, so never re-quantized) is untouched. tests/serve/test_engine_quantized.py holds
the engine on a prepared model to a separately loaded, untouched one. Its FP4 cast gets a CPU kernel
(register_cpu_fp4_cast).
"""

from __future__ import annotations

import torch


def prepare_for_serving(model: torch.nn.Module) -> None:
    """Drop compressed-tensors' offload wrappers from `model`, in place (nothing to drop: a no-op), and give
    compressed-tensors qverify's CPU FP4 cast (register_cpu_fp4_cast)."""
    register_cpu_fp4_cast()
    try:
        from compressed_tensors.offload.dispatch import remove_dispatch
    except ImportError:  # a compressed-tensors without offload wrappers
        return
    remove_dispatch(model, onload_tensors=True)


_FP4_REGISTERED: list[bool] = []


def register_cpu_fp4_cast() -> None:
    """qverify's C++ `cast_to_fp4` (mqa_kernel.cpp) as a compressed-tensors backend for fp32 CPU tensors, through
    compressed-tensors' own extension point (`ImplBackend.register`, where its Triton kernel registers for GPUs).

    Why: its eager CPU path is eight masked assignments over the tensor (~30 passes), which ran ~14% of an NVFP4
    candidate build's engine time (every quantized Linear's input is fake-quantized per call). The kernel maps each
    value through the same interval bounds and the same sign rule, so the values are the same
    (tests/serve/test_mqa_kernel.py compares it with the eager function, edge values included). No kernel (no
    compiler): nothing is registered and the eager path runs."""
    if _FP4_REGISTERED:
        return
    _FP4_REGISTERED.append(True)
    try:
        from compressed_tensors.utils.impl_backend import ImplBackend
    except ImportError:
        return
    from qverify.serve.embedded import mqa_kernel

    if mqa_kernel.load() is None:
        return

    def _qverify_cast_to_fp4_cpu(x: torch.Tensor) -> torch.Tensor:
        return mqa_kernel.load().cast_to_fp4(x)

    ImplBackend.register("cast_to_fp4", lambda x: x.device.type == "cpu" and x.dtype == torch.float32, 1)(
        _qverify_cast_to_fp4_cpu)
