"""HBM per GPU type: the nominal figures capacity articles use, overridable per call.

Units: bytes, with "GB" meaning 10^9 bytes throughout qverify.capacity, because the
published Kimi K2.6 arithmetic (595 GB / 4 subtracted from 180 GB) uses the nominal
spec-sheet numbers that way.
"""

from __future__ import annotations

from pydantic import ConfigDict

from qverify.errors import BadInput
from qverify.registry import unknown_message
from qverify.strict import Strict

GB = 10**9
GIB = 2**30


class GPU(Strict):
    model_config = ConfigDict(frozen=True)  # Strict's rules, and hashable

    name: str
    hbm_bytes: int
    source: str = "nominal spec figure"


# Nominal spec-sheet figures: what capacity articles (and the Kimi K2.6 article check) use.
HBM_GB: dict[str, float] = {"b200": 180.0, "h200": 141.0, "h100": 80.0}
# What the GPU itself reports (nvidia-smi memory.total, MiB): the memory SGLang's --mem-fraction-static divides.
# B200 183,359 MiB = 192.3 GB (NVIDIA markets 180 GB usable / 192 GB HBM3e); H200 143,771 MiB = 150.8 GB
# (spec sheet: 141 GB); H100 SXM 80 GB 81,559 MiB = 85.5 GB. The planner uses these.
HBM_MIB: dict[str, int] = {"b200": 183_359, "h200": 143_771, "h100": 81_559}


def gpu(name: str, hbm_gb: float | None = None) -> GPU:
    """A GPU from the table, or any name when `hbm_gb` is given (the override)."""
    key = name.strip().lower()
    if hbm_gb is not None:
        if not hbm_gb > 0:
            raise BadInput(f"--hbm-gb must be positive, got {hbm_gb}", fix="pass the GPU memory in GB, e.g. --hbm-gb 141")
        return GPU(name=key, hbm_bytes=round(hbm_gb * GB), source="--hbm-gb override")
    if key not in HBM_GB:
        raise BadInput(
            unknown_message("GPU", name, HBM_GB, lookup=key),
            fix=f"use one of: {', '.join(sorted(HBM_GB))}, or give its memory with --hbm-gb",
        )
    return GPU(name=key, hbm_bytes=HBM_MIB[key] * 2**20,
               source=f"reported by the GPU: {HBM_MIB[key]:,} MiB; spec sheet {HBM_GB[key]:g} GB")
