"""qverify's CPU kernels for the embedded engine, built on first use as one extension (mqa_kernel.cpp and
prefill_kernel.cpp in one translation unit: they share the lane width and the vectorised exp); torch code where
they cannot be built. What each replaces, and what it is tested against: docs/serve.md, "qverify's CPU kernels".
- mqa_decode / mqa_partial: absorbed decode attention (MQA over the latent), a whole layer in one call;
- causal_prefill: a prompt's causal attention, flash-style (mla.causal_attention);
- rope_qk, cast_to_fp4 (registered with compressed-tensors by ct_forward), fp8_roundtrip, gumbel_argmax: one-pass
  forms of a few torch ops each, bit-equal to them.

Why hand-written: in decode each cached latent row serves only the query rows of the sequences that read it (4
heads on qverify-tiny, x3 for a prompt shared by 3 replicates). torch's CPU flash kernel and MKL's GEMMs run such
4-row products at 20-30 GFLOP/s (GEMM peak ~95 on the AVX2 boxes), so absorbed attention was ~60% of a full-batch
decode step. In prefill, V (32 wide) is narrower than Q/K (96), which torch's fused SDPA handles by padding V.

Numerics: fp32 throughout, a different summation order than torch's kernel (differences ~1e-6, as between any two
attention kernels; tests hold it to torch's within float tolerance, and the engine's outputs to HF's plain forward).
Each sequence is computed alone in a fixed order, so a sequence's result does not depend on the batch.

Built with torch.utils.cpp_extension (gcc, ninja) into torch's extension cache, once per machine: ~40 s on this box
(ModelRunner builds it at construction, outside any timed step). No compiler, no AVX2/FMA, a build error, or
QVERIFY_MQA_KERNEL=0: torch's flash kernel (and mla.causal_attention's torch code for prefill), with one warning.
QVERIFY_PREFILL_KERNEL=0 turns off only the prefill kernel (A/B runs).
"""

from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path

import torch

log = logging.getLogger(__name__)
_SRC = Path(__file__).with_name("mqa_kernel.cpp")
_PREFILL_SRC = Path(__file__).with_name("prefill_kernel.cpp")  # compiled after _SRC, in the same translation unit
_STATE: dict = {}
_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu


def load() -> object | None:
    """The compiled kernel module, or None (then callers use torch's flash kernel)."""
    if "ext" in _STATE:
        return _STATE["ext"]
    _STATE["ext"] = None
    if os.environ.get("QVERIFY_MQA_KERNEL", "1") == "0":
        return None
    cap = torch.backends.cpu.get_cpu_capability()
    if cap not in ("AVX2", "AVX512"):
        log.warning("mqa kernel: this CPU has no AVX2; decode attention uses torch's flash kernel")
        return None
    # 16 lanes where torch itself runs AVX-512 kernels (the source picks its width from __AVX512F__), else 8
    flags = ["-O3", "-mavx2", "-mfma", "-ffp-contract=fast"] + (["-mavx512f", "-mavx512vl"] if cap == "AVX512" else [])
    try:
        from torch.utils.cpp_extension import load_inline

        # one translation unit: the prefill kernel uses the decode kernel's lane width and exp (one build, one cache
        # entry; the digest covers both sources)
        src = _SRC.read_text() + "\n" + _PREFILL_SRC.read_text()
        digest = hashlib.sha256((src + torch.__version__ + " ".join(flags)).encode()).hexdigest()[:12]
        name = f"qverify_mqa_{digest}"  # a changed source, torch or instruction set is a new build
        ext = load_inline(name, cpp_sources=[src], functions=["mqa_partial", "mqa_decode", "lanes", "value_columns", "rope_qk", "cast_to_fp4", "fp8_roundtrip", "gumbel_argmax", "causal_prefill"], extra_cflags=flags)
        _STATE["ext"], _STATE["lanes"], _STATE["cols"] = ext, int(ext.lanes()), int(ext.value_columns())
        # QVERIFY_PREFILL_KERNEL=0: prefill attention runs mla.causal_attention's torch code (A/B runs), the rest
        # of the kernel as usual
        _STATE["prefill"] = os.environ.get("QVERIFY_PREFILL_KERNEL", "1") != "0"
    except Exception as e:  # noqa: BLE001 - no compiler / ninja / headers: the flash kernel still serves
        log.warning("mqa kernel not built (%s); decode attention uses torch's flash kernel", str(e).splitlines()[0])
    return _STATE["ext"]


def ready() -> bool:
    return load() is not None


def length_mask(lens: torch.Tensor, L: int) -> torch.Tensor:
    """Additive mask [N, R or 1, L] from lens [N, R or 1]: 0 for the first lens rows, -inf after."""
    return torch.zeros(*lens.shape, L).masked_fill_(torch.arange(L) >= lens[..., None], float("-inf"))


def attention_pieces(q: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor | None, C: int):
    """Softmax pieces for q [N, R, W] against rows [N, L, W] (each sequence's latent rows serve as keys, and their
    first C values as values): (log-sum-exp [N, R, 1], normalised output [N, R, C]). lens [N, R or 1] int64: query
    row r of sequence n sees its first lens[n, r] rows (None: all L)."""
    ext = load()
    if (ext is not None and q.dtype == rows.dtype == torch.float32 and q.stride(-1) == 1 and rows.stride(-1) == 1
            and q.shape[-1] % _STATE["lanes"] == 0 and C % _STATE["cols"] == 0):
        return ext.mqa_partial(q, rows, lens, C)
    mask = None if lens is None else length_mask(lens, rows.shape[1])
    o, lse = _FLASH(q[:, None], rows[:, None], rows[:, None], 0.0, False,
                    attn_mask=None if mask is None else mask[:, None], scale=1.0)[:2]
    return lse[:, 0, :, None], o[:, 0, :, :C]


def fused_decode(q: torch.Tensor, prompts: list[torch.Tensor], prompt_of: torch.Tensor, gen: torch.Tensor,
                 gen_lens: torch.Tensor, order: torch.Tensor, C: int) -> torch.Tensor | None:
    """Decode attention in one call, or None when the kernel is not there (then: split_kv.decode_attention).
    q [B, R, W]; sequence b attends to prompts[prompt_of[b]] ([P, W], a prompt's rows, shared by its
    replicates) and then to its own rows gen[b] ([G, W]; query row r sees the first gen_lens[b, r]) in one softmax.
    `order`: the sequences by prompt, so a prompt's rows are read while in cache. Returns [B, R, C]."""
    ext = load()
    if (ext is None or q.dtype != torch.float32 or q.stride(-1) != 1 or gen.stride(-1) != 1
            or q.shape[-1] % _STATE["lanes"] or C % _STATE["cols"]):
        return None
    return ext.mqa_decode(q, prompts, prompt_of, gen, gen_lens, order, C)


def rope_qk(q: torch.Tensor, kv: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, dn: int, interleave: bool,
            latent: torch.Tensor) -> torch.Tensor | None:
    """The rope part of a layer's projections in one pass (mla.MLALayer.project): returns q_rot [N, H, dr] from
    q [N, H, dn + dr], and writes the key's rope part (kv [N, C + dr]'s last dr values, roped) into latent[:, C:];
    the same bits as mla.rope_rows. None when the kernel is not built (then: rope_rows)."""
    ext = load()
    if ext is None or not (q.dtype == kv.dtype == latent.dtype == cos.dtype == torch.float32):
        return None
    return ext.rope_qk(q, kv, cos, sin, dn, interleave, latent)


def causal_prefill(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, q2: torch.Tensor | None = None,
                   k2: torch.Tensor | None = None) -> torch.Tensor | None:
    """softmax(q k^T * scale, causal) v in one kernel call (prefill_kernel.cpp), [n, H, dv]; None when the kernel
    is not built, QVERIFY_PREFILL_KERNEL=0, an input is not fp32 or a shape is not supported (then:
    mla.causal_attention's torch code). q, k [H, n, d], v [H, n, dv], any strides; q2, k2 (optional, [H, n, d2]):
    further query / key values after q's and k's, so a query split in two (q_nope, q_rot) needs no cat."""
    ext = load()
    if (ext is None or not _STATE["prefill"] or q.dtype != torch.float32 or k.dtype != torch.float32
            or v.dtype != torch.float32 or v.shape[-1] % _STATE["lanes"] or v.shape[-1] > 256
            or q.shape[-1] + (0 if q2 is None else q2.shape[-1]) > 1024):
        return None
    if (q2 is not None and q2.dtype != torch.float32) or (k2 is not None and k2.dtype != torch.float32):
        return None
    return ext.causal_prefill(q, q2, k, k2, v, scale)
