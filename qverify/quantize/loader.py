"""THE loader for serving builds: hashes first, then an integrity-checked reload.

`load_build` is what the local server uses, and `verify_build` (run after every build
and by `qverify verify-build`) goes through exactly the same code, so a build that
verifies is a build that serves the weights it claims to.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from qverify.models import BuildManifest
from qverify.quantize.manifest import IntegrityError, check_hashes, read_manifest

DRAFTER_DIR = "drafter"


class VerifyReport(BaseModel):
    """What `verify_build` checked; it raises IntegrityError instead of returning a failure."""

    build_dir: str
    build_id: str
    recipe: str
    ok: bool = True
    hashed: int = Field(description="files and tensors whose sha256 matched build.json")
    compared: int = Field(description="reloaded tensors compared bitwise to the checkpoint")
    target_load: str = Field(description="'transformers' (fused experts) or 'linearized' (quantized experts)")
    drafter_load: str | None = None
    kv_cache_quantized: bool = False
    seconds: float = 0.0


@dataclass
class LoadedBuild:
    """A build in memory. Toggle `quantization_enabled` to compare against the unquantized math."""

    model: Any
    tokenizer: Any
    drafter: Any | None
    manifest: BuildManifest
    build_dir: Path
    checks: dict[str, Any] = field(default_factory=dict)
    _enabled: bool = True

    @property
    def quantized(self) -> bool:
        return bool(self.manifest.quantization)

    @property
    def quantization_enabled(self) -> bool:
        return self._enabled

    @quantization_enabled.setter
    def quantization_enabled(self, on: bool) -> None:
        self.set_quantization_enabled(on)

    def set_quantization_enabled(self, on: bool) -> None:
        """Switch compressed-tensors fake quantization (weights' activations, KV cache) on or off.

        Off, an fp8kv build's logits equal the baseline's exactly (its weights are untouched);
        a weight-quantized build keeps its dequantized weights, so only activation and KV
        rounding go away.
        """
        for m in (self.model, self.drafter):
            if m is not None:
                set_quantization_enabled(m, on)
        self._enabled = on


def set_quantization_enabled(model, on: bool) -> None:
    from compressed_tensors.quantization import disable_quantization, enable_quantization

    model.apply(enable_quantization if on else disable_quantization)



def _kv_quantized(model) -> bool:
    return any(hasattr(m, "kv_cache") and getattr(m, "quantization_scheme", None) is not None for m in model.modules())


def load_build(build_dir: Path | str, device: str = "cpu", check_hashes_first: bool = True,
               trust_remote_code: bool = False) -> LoadedBuild:
    """Load a build (target, tokenizer, drafter) after checking it against build.json.

    Raises IntegrityError (a BadInput, exit 4) for a missing/invalid manifest, a tampered or
    truncated file, or any tensor that is missing, unexpected, freshly initialised or different.
    `trust_remote_code`: the user's permission (never build.json's), checked before anything is imported.
    """
    build_dir = Path(build_dir).expanduser().resolve()
    manifest = read_manifest(build_dir)
    remote_code = manifest.remote_code(trust_remote_code)
    from transformers import AutoTokenizer

    from qverify.quantize.checkpoint import load_checkpoint
    from qverify.quantize.text_view import text_view, wrapper_config

    wrapper = wrapper_config(build_dir)
    checks: dict[str, Any] = {}
    if check_hashes_first:
        checks["hashed"] = check_hashes(build_dir, manifest)
    if wrapper is not None:  # a kimi_k25 build: its text model, the weights SGLang's kimi_k25 routes text through
        with text_view(build_dir, wrapper) as view:
            model, target_check = load_checkpoint(view)
    else:
        model, target_check = load_checkpoint(build_dir)
    checks["target"] = target_check
    drafter, drafter_check = None, None
    if manifest.drafter_kind == "eagle3":  # not a causal LM: checked for SGLang here, loaded by the embedded engine
        from qverify.quantize.eagle3 import check_eagle3

        checks["drafter_eagle3"] = check_eagle3(build_dir / DRAFTER_DIR, json.loads((build_dir / "config.json").read_text()))
    elif (build_dir / DRAFTER_DIR / "config.json").is_file():
        drafter, drafter_check = load_checkpoint(build_dir / DRAFTER_DIR)
        checks["drafter"] = drafter_check
    elif manifest.drafter:
        raise IntegrityError(f"{build_dir.name}: build.json names a drafter but {DRAFTER_DIR}/ is missing",
                             fix="rebuild it with --force")
    if manifest.kv_dtype.startswith("fp8") and not _kv_quantized(model):
        raise IntegrityError(f"{build_dir.name}: build.json says {manifest.kv_dtype} KV cache but the loaded model "
                             "has no KV quantization", fix="rebuild it with --force")
    # Remote tokenizer code (Kimi's tokenization_kimi.py) runs only when the build needs it and the user allowed it.
    tokenizer = AutoTokenizer.from_pretrained(build_dir, trust_remote_code=remote_code)
    if device != "cpu":
        model.to(device)
        if drafter is not None:
            drafter.to(device)
    return LoadedBuild(model=model, tokenizer=tokenizer, drafter=drafter, manifest=manifest,
                       build_dir=build_dir, checks=checks)


def verify_build(build_dir: Path | str, trust_remote_code: bool = False,
                 source_digests: dict[str, str] | None = None) -> VerifyReport:
    """Hashes + reload through `load_build`; returns the report or raises IntegrityError.

    A build from a source that ships quantized (Kimi K2.x; built by `shipped_build`) is verified without rebuilding
    the model: at 1T a reload would need several TB of host RAM. Its hashes are checked, its copied tensors against the
    source's own digests (`source_digests`, given during a build), and only what the recipe wrote is reloaded."""
    t0 = time.time()
    build_dir = Path(build_dir).expanduser().resolve()
    manifest = read_manifest(build_dir)
    manifest.remote_code(trust_remote_code)  # exit 4 before anything of the build is imported
    if manifest.source_quantization is not None:
        from qverify.quantize.shipped_build import verify_streamed

        hashed, compared = verify_streamed(build_dir, manifest, source_digests)
        drafter_load = None
        if manifest.drafter_kind == "eagle3":  # not a causal LM: checked for SGLang and carried, never run here
            from qverify.quantize.eagle3 import check_eagle3

            check_eagle3(build_dir / DRAFTER_DIR, json.loads((build_dir / "config.json").read_text()))
            drafter_load = "eagle3 (checked, not loaded)"
        elif (build_dir / DRAFTER_DIR / "config.json").is_file():
            compared += load_checkpoint_checked(build_dir / DRAFTER_DIR)
            drafter_load = "transformers"
        return VerifyReport(build_dir=str(build_dir), build_id=manifest.build_id, recipe=manifest.recipe, hashed=hashed,
                            compared=compared, target_load="streamed", kv_cache_quantized=manifest.kv_dtype.startswith("fp8"),
                            drafter_load=drafter_load, seconds=round(time.time() - t0, 2))
    lb = load_build(build_dir, trust_remote_code=trust_remote_code)
    target, drafter = lb.checks["target"], lb.checks.get("drafter")
    return VerifyReport(build_dir=str(lb.build_dir), build_id=lb.manifest.build_id, recipe=lb.manifest.recipe,
                        hashed=lb.checks.get("hashed", 0), compared=target.tensors + (drafter.tensors if drafter else 0),
                        target_load=target.mode,
                        drafter_load=drafter.mode if drafter else ("eagle3 (checked, not loaded)" if "drafter_eagle3" in lb.checks else None),
                        kv_cache_quantized=_kv_quantized(lb.model), seconds=round(time.time() - t0, 2))


def load_checkpoint_checked(path: Path) -> int:
    """Reload one (small) checkpoint and compare it bitwise; returns the tensors compared."""
    from qverify.quantize.checkpoint import load_checkpoint

    return load_checkpoint(path)[1].tensors
