"""The MoE block for plain fused experts, sized to a serving batch; every other MoE runs as loaded.

transformers 5.17's default experts path (`grouped_mm_experts_forward`) is built for GPUs and autograd: sentinel
masks, histc, masked fills and an inverse permutation around `torch._grouped_mm`, whose CPU kernel loops over the
experts anyway. At a decode batch of 60 tokens it costs 0.68 ms per layer for ~0.15 ms of GEMM work (profile in
docs/serving.md). Here: one stable sort by expert, then one GEMM pair per hit expert on a contiguous slice.

Numerics are the same computation as HF's: the same router module, each routed row through F.linear with its
expert's weights, the gate applied by the module's own `_apply_gate`, weighted, then summed over the top-k in
routing order, then the shared experts added. Only plain fused experts take this path (3-D `gate_up_proj` /
`down_proj`, no bias, not transposed, no compressed-tensors scheme anywhere in the block); quantized experts are
linearized per-expert Linear modules and run as loaded, so compressed-tensors' forward stays their reference.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def plain_fused_experts(mlp: torch.nn.Module) -> bool:
    """This MoE block can take the batched path (see the module docstring)."""
    ex = getattr(mlp, "experts", None)
    if ex is None or not hasattr(mlp, "gate") or not hasattr(mlp, "shared_experts"):
        return False
    gu, down = getattr(ex, "gate_up_proj", None), getattr(ex, "down_proj", None)
    if not (isinstance(gu, torch.Tensor) and isinstance(down, torch.Tensor) and gu.dim() == 3 and down.dim() == 3):
        return False
    if getattr(ex, "has_bias", False) or getattr(ex, "is_transposed", False) or not getattr(ex, "has_gate", True):
        return False
    if not getattr(ex, "is_concatenated", True) or not hasattr(ex, "_apply_gate"):
        return False
    return not any(hasattr(m, "quantization_scheme") for m in mlp.modules())


def routed_experts(ex: torch.nn.Module, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, D], top-k expert ids and weights [N, k] -> the weighted sum of the routed experts' outputs [N, D]."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=ex.gate_up_proj.shape[0]).tolist()
    rows = x[order // k]
    out = torch.empty(n * k, x.shape[-1], dtype=x.dtype)
    start = 0
    for e, c in enumerate(counts):
        if c:
            h = ex._apply_gate(F.linear(rows[start: start + c], ex.gate_up_proj[e]))
            out[start: start + c] = F.linear(h, ex.down_proj[e])
            start += c
    routed = torch.empty_like(out)
    routed[order] = out
    return (routed * w.reshape(-1, 1)).view(n, k, -1).sum(1).to(x.dtype)  # as HF: weights (fp32) promote the sum


def moe_forward(mlp: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """DeepseekV3MoE.forward with routed_experts in place of the experts module; h [1, N, D]."""
    _, weights, idx = mlp.gate(h)
    routed = routed_experts(mlp.experts, h.reshape(-1, h.shape[-1]), idx, weights).view(h.shape)
    return routed + mlp.shared_experts(h)
