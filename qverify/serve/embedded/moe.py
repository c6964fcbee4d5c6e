"""The MoE block for plain fused experts, sized to a serving batch; every other MoE runs as loaded.

transformers 5.17's default experts path (`grouped_mm_experts_forward`) is built for GPUs and autograd: sentinel
masks, histc, masked fills and an inverse permutation around `torch._grouped_mm`, whose CPU kernel loops over the
experts anyway. At a decode batch of 60 tokens it costs 0.68 ms per layer for ~0.15 ms of GEMM work (profile in
docs/serving.md). Here: one stable sort by expert, then one GEMM pair per hit expert on a contiguous slice.

Numerics are the same computation as HF's: the same router module, each routed row through F.linear with its
expert's weights, the gate applied by the module's own `_apply_gate`, weighted, then summed over the top-k in
routing order, then the shared experts added. Only plain fused experts take this path (3-D `gate_up_proj` /
`down_proj`, no bias, not transposed, no compressed-tensors scheme on the experts or the router); quantized experts
are linearized per-expert Linear modules and run as loaded, and so do quantized shared experts (NVFP4 in the main
job's candidate), so compressed-tensors' forward stays their reference.
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
    # the routed experts and the router only: quantized shared experts are called as loaded (moe_forward)
    return not any(hasattr(m, "quantization_scheme") for part in (ex, mlp.gate) for m in part.modules())


def _silu_gate(ex: torch.nn.Module):
    """transformers' default `_apply_gate` with SiLU (chunk, silu(gate) * up), as a plain function (the same ops
    without two module calls per expert); None for any other gate."""
    from transformers.activations import SiLUActivation
    from transformers.integrations.moe import _default_apply_gate

    if getattr(type(ex)._apply_gate, "__code__", None) is not _default_apply_gate.__code__:
        return None
    if type(getattr(ex, "act_fn", None)) is not SiLUActivation:
        return None

    def gate(gate_up: torch.Tensor) -> torch.Tensor:
        g, up = gate_up.chunk(2, dim=-1)
        return F.silu(g) * up
    return gate


def routed_experts(ex: torch.nn.Module, x: torch.Tensor, idx: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """x [N, D], top-k expert ids and weights [N, k] -> the weighted sum of the routed experts' outputs [N, D]."""
    n, k = idx.shape
    flat = idx.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=ex.gate_up_proj.shape[0]).tolist()
    rows = x[order // k]
    out = torch.empty(n * k, x.shape[-1], dtype=x.dtype)
    apply_gate = _silu_gate(ex) or ex._apply_gate
    gate_up, down = ex.gate_up_proj, ex.down_proj
    start = 0
    for e, c in enumerate(counts):
        if c:  # F.linear without a bias is mm(x, W.t()): written straight into this expert's rows of `out`
            h = apply_gate(torch.mm(rows[start: start + c], gate_up[e].t()))
            torch.mm(h, down[e].t(), out=out[start: start + c])
            start += c
    routed = torch.empty_like(out)
    routed[order] = out
    return (routed * w.reshape(-1, 1)).view(n, k, -1).sum(1).to(x.dtype)  # as HF: weights (fp32) promote the sum


def route(gate: torch.nn.Module, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepseekV3TopkRouter.forward's (weights, indices). With one expert group (qverify-tiny, Kimi K2) its group
    mask keeps every expert, so the same ops minus the masking give the same bits; anything else runs as loaded."""
    if type(gate).__name__ != "DeepseekV3TopkRouter" or getattr(gate, "num_group", None) != 1:
        return gate(h)[1:]
    hs = h.view(-1, gate.hidden_dim)
    scores = F.linear(hs.type(torch.float32), gate.weight.type(torch.float32)).sigmoid()
    idx = torch.topk(scores + gate.e_score_correction_bias, k=gate.top_k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, idx)
    if gate.norm_topk_prob:
        weights /= weights.sum(dim=-1, keepdim=True) + 1e-20
    return weights * gate.routed_scaling_factor, idx


def moe_forward(mlp: torch.nn.Module, h: torch.Tensor) -> torch.Tensor:
    """DeepseekV3MoE.forward with routed_experts in place of the experts module; h [1, N, D]."""
    weights, idx = route(mlp.gate, h)
    routed = routed_experts(mlp.experts, h.reshape(-1, h.shape[-1]), idx, weights).view(h.shape)
    return routed + mlp.shared_experts(h)
