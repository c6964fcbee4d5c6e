"""The target of a build from a source that ships quantized (Kimi K2.x, flat or as the kimi_k25 wrapper), at 1T.

produce:
1. calibrate and quantize the text model only, loaded layer by layer (`layerwise.py`: never all experts dequantized);
   save it compressed into a scratch dir;
2. what the recipe wrote = the scratch tensors that are new or differ from the source (by sha256);
3. copy every source shard under its own name, minus the tensors the recipe replaced, hashing while copying
   (`streamcopy.py`): routed experts, vision tower, projector and all else come through byte for byte;
4. the recipe's tensors go in one extra shard, named as the source names its text model (`language_model.` kept);
5. config.json is the source's own (the wrapper stays a wrapper) with the merged quantization_config where the
   source had it; then SGLang's KV scale and the non-weight files.
verify (`verify_streamed`): the build's hashes against build.json (copied tensors were checked against the source's
own digests while copying); only the recipe's shard is reloaded, shard by shard, and checked against the text model.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qverify.quantize import manifest as mf
from qverify.quantize.layout import Layout
from qverify.quantize.shards import INDEX
from qverify.quantize.shipped import Shipped, merged_config
from qverify.quantize.source import carry_files

RECIPE_SHARD = "model-recipe.safetensors"
Progress = Callable[[str], None]


def _scratch_tensors(scratch: Path, layout: Layout) -> dict[str, tuple[Path, str, str]]:
    """{source-style name: (scratch shard, scratch name, sha256)} for everything llm-compressor saved."""
    out = {}
    for p in sorted(scratch.glob("*.safetensors")):
        for name, digest in mf.tensor_digests(p).items():
            out[layout.full_name(name)] = (p, name, digest)
    return out


def _write_index(build_dir: Path) -> None:
    shards = sorted(build_dir.glob("*.safetensors"))
    wmap = {n: p.name for p in shards for n in mf.safetensors_header(p)[0]}
    total = sum(p.stat().st_size for p in shards)
    (build_dir / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))},
                                              indent=2) + "\n")


def _write_config(build_dir: Path, model_dir: Path, layout: Layout, shipped: Shipped, recipe_qc: dict | None) -> None:
    """The source's config.json with the merged quantization_config at the top level (where SGLang's ModelConfig and
    transformers read a wrapper's) and, when the source also had one there, in text_config."""
    cfg = json.loads((model_dir / "config.json").read_text())
    wmap = json.loads((build_dir / INDEX).read_text())["weight_map"]
    # Module names as the serving engine's text model sees them (SGLang's kimi_k25 builds DeepSeek-V3 with prefix "").
    text_map = {t: s for n, s in wmap.items() if (t := layout.text_name(n)) is not None}
    merged = merged_config(shipped, recipe_qc, text_map)
    cfg["quantization_config"] = merged
    if isinstance(cfg.get("text_config"), dict) and "quantization_config" in cfg["text_config"]:
        cfg["text_config"]["quantization_config"] = merged
    (build_dir / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def produce(tmp: Path, model_dir: Path, layout: Layout, shipped: Shipped, source_digests: dict[str, str],
            quantize: Callable[[Any], None] | None, progress: Progress | None = None):
    """Write the target into `tmp`. `quantize(model)` runs the recipe's oneshot in place (None: nothing to change).
    Returns (module counts or None, the recipe's quantization_config, carried files, {'file::tensor': sha256} of the
    copied shards)."""
    from qverify.quantize import compress

    tmp.mkdir(parents=True, exist_ok=True)
    if quantize is None:  # as shipped: every file byte for byte, the index included
        digests = _copy(model_dir, tmp, set(), source_digests, progress)
        if (model_dir / INDEX).is_file():
            shutil.copy2(model_dir / INDEX, tmp / INDEX)
        return None, None, carry_files(model_dir, tmp), digests
    from qverify.quantize.layerwise import load_layerwise
    from qverify.quantize.shipped import drop_shipped_modules

    model, onloader = load_layerwise(model_dir, layout, shipped, progress)
    try:
        quantize(model)
    finally:
        onloader.close()
    counts = mf.module_counts(model)  # before saving: save compresses weights in place
    drop_shipped_modules(model, Shipped(config=shipped.config, modules={layout.text_name(m): v for m, v in shipped.modules.items()}))
    scratch = tmp.parent / f"{tmp.name}.scratch"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        compress.save(model, scratch)
        del model
        recipe_qc = json.loads((scratch / "config.json").read_text()).get("quantization_config")
        saved = _scratch_tensors(scratch, layout)
        by_name = {k.split("::", 1)[1]: v for k, v in source_digests.items()}
        written = {n: v for n, v in saved.items() if by_name.get(n) != v[2]}
        touched = {n.rsplit(".", 1)[0] for n in written}
        drop = {n for n in by_name if n.rsplit(".", 1)[0] in touched and n not in saved}
        digests = _copy(model_dir, tmp, drop, source_digests, progress)
        _write_recipe_shard(tmp, written)
        if (scratch / "llmcompressor_recipe.yaml").is_file():
            shutil.copy2(scratch / "llmcompressor_recipe.yaml", tmp / "llmcompressor_recipe.yaml")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _write_index(tmp)
    _write_config(tmp, model_dir, layout, shipped, recipe_qc)
    # no KV scale for SGLang (qverify/quantize/kv_scales.py); the badscale control's is added by build.py
    return counts, recipe_qc, carry_files(model_dir, tmp), digests


def _copy(model_dir: Path, tmp: Path, drop: set[str], expect: dict[str, str], progress: Progress | None) -> dict[str, str]:
    from qverify.quantize.streamcopy import copy_shards

    return copy_shards(model_dir, tmp, drop, expect, progress)


def _write_recipe_shard(tmp: Path, written: dict[str, tuple[Path, str, str]]) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    tensors = {}
    for name, (shard, local, _) in written.items():
        with safe_open(shard, "pt") as f:
            tensors[name] = f.get_tensor(local)
    if tensors:
        save_file(tensors, tmp / RECIPE_SHARD, metadata={"format": "pt"})


def verify_streamed(build_dir: Path, manifest, source_digests: dict[str, str] | None = None) -> tuple[int, int]:
    """(files and tensors hashed, recipe tensors reloaded and checked); IntegrityError on any mismatch.

    No model is rebuilt: build.json's hashes are checked (one read of the build); copied tensors must carry the
    source's own digests (`source_digests`, when the source is at hand); each tensor the recipe wrote is reloaded,
    one shard at a time, and must belong to a module of the text model whose weight it decompresses to."""
    from safetensors import safe_open

    from qverify.quantize.kv_scales import SGLANG_SCALES_SHARD
    from qverify.quantize.layout import read_layout
    from qverify.quantize.loader_checks import check_recipe_tensors

    hashed = mf.check_hashes(build_dir, manifest)
    if source_digests is not None:
        built = manifest.tensor_hashes
        for key, digest in source_digests.items():
            if key in built and built[key] != digest:
                raise mf.IntegrityError(f"{build_dir.name}: {key} differs from the source's", fix="rebuild it with --force")
    config = json.loads((build_dir / "config.json").read_text())
    names = [n for p in build_dir.glob("*.safetensors") for n in mf.safetensors_header(p)[0]]
    layout = read_layout(build_dir, config, names)
    tensors = {}  # the recipe's own tensors: small (shared experts, KV scales), so read together
    for shard in (RECIPE_SHARD, SGLANG_SCALES_SHARD):
        if (build_dir / shard).is_file():
            with safe_open(build_dir / shard, "pt") as f:
                tensors |= {layout.text_name(k) or k: f.get_tensor(k) for k in f.keys()}  # noqa: SIM118
    from qverify.quantize.kv_scales import declared_sglang_k_scale

    return hashed, check_recipe_tensors(tensors, layout, config.get("quantization_config") or {}, build_dir.name,
                                        declared_sglang_k_scale(build_dir))
