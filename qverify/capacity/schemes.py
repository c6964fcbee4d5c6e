"""Bytes a Linear weight takes on the GPU under each weight scheme, scales included.

The layouts follow compressed-tensors 0.19's saved tensors (checked against real
llm-compressor checkpoints in tests/capacity/test_weights.py):
  nvfp4     weight_packed 4 bit + weight_scale FP8 per 16 weights + weight_global_scale
            and input_global_scale (one fp32 each per Linear)
  fp8       FP8_DYNAMIC: 8 bit + one scale per output channel (model dtype, bf16)
  fp8_tensor  FP8 static: 8 bit + bf16 weight_scale + bf16 input_scale per Linear
  fp8_block 8 bit + one bf16 scale per 128x128 block (DeepSeek-V3's own FP8 files keep
            fp32 scales: 2 bytes more per 16,384 weights, below the planner's resolution)
  int4_g32  W4A16 group 32, bf16 scales + an int64[2] weight_shape (Kimi K2.6's shipped INT4)
  int4_g128 the same at llm-compressor's W4A16 preset group size, 128
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import ConfigDict

from qverify.strict import Strict

SchemeName = Literal["bf16", "fp8", "fp8_tensor", "fp8_block", "nvfp4", "int4_g32", "int4_g128"]


class LinearShape(Strict):
    """`count` Linear layers of shape out_features x in_features."""

    model_config = ConfigDict(frozen=True)  # Strict's rules, and hashable

    out_features: int
    in_features: int
    count: int = 1

    @property
    def params(self) -> int:
        return self.out_features * self.in_features * self.count


def linear_bytes(shape: LinearShape, scheme: str) -> int:
    """Bytes of `shape.count` Linear weights under `scheme`, scales included."""
    n, k = shape.out_features, shape.in_features
    w = n * k
    if scheme == "bf16":
        one = 2 * w
    elif scheme == "fp8":
        one = w + 2 * n
    elif scheme == "fp8_tensor":
        one = w + 2 + 2
    elif scheme == "fp8_block":
        one = w + 2 * math.ceil(n / 128) * math.ceil(k / 128)
    elif scheme == "nvfp4":
        one = math.ceil(w / 2) + n * math.ceil(k / 16) + 4 + 4
    elif scheme in ("int4_g32", "int4_g128"):
        group = 32 if scheme == "int4_g32" else 128
        one = math.ceil(w / 2) + 2 * n * math.ceil(k / group) + 16
    else:  # the QuantPlan model validates names; this guards direct callers
        raise ValueError(f"unknown weight scheme {scheme!r}")
    return one * shape.count
