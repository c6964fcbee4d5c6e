"""compressed-tensors' forward, prepared for serving: the same numerics without per-call work that serving never needs.

A build loaded through compressed-tensors comes back with offload wrappers (its `OffloadCache` / dispatch): every
module call "onloads" its parameters with `Tensor.to`, a no-op on a CPU-only server that cost ~10% of a candidate
build's engine time (profile of `benchmarks/engine_throughput.py --model <fp8kv_nvfp4shared build>`: `send_tensors`
and 50k `Tensor.to` calls). `remove_dispatch(onload_tensors=True)` is compressed-tensors' own way to drop them; the
quantized forward (`set_forward_quantized`: input fake quant per call; a loaded build's weights are already
decompressed, status DECOMPRESSED, so never re-quantized) is untouched. tests/serve/test_engine_quantized.py holds
the engine on a prepared model to a separately loaded, untouched one.
"""

from __future__ import annotations

import torch


def prepare_for_serving(model: torch.nn.Module) -> None:
    """Drop compressed-tensors' offload wrappers from `model`, in place (nothing to drop: a no-op)."""
    try:
        from compressed_tensors.offload.dispatch import remove_dispatch
    except ImportError:  # a compressed-tensors without offload wrappers
        return
    remove_dispatch(model, onload_tensors=True)
