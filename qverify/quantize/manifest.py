"""build.json: tensor hashes, bytes by dtype, KV bytes/token and the quantization summary.

Tensor hashes are sha256 over each tensor's raw bytes, read straight from the
safetensors file by its header offsets (no torch, works for fp8/uint8, and a truncated
file is caught by its own header). Files that are not safetensors (config.json,
tokenizer, recipe.yaml) are hashed whole under the name `<file>::*`, so editing a
config — e.g. deleting kv_cache_scheme — is caught like a tampered tensor.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.models import BuildManifest, SchemeSummary
from qverify.workdir import BUILD_MANIFEST, manifest_path, read_build_manifest

WHOLE_FILE = "*"
_CHUNK = 1 << 22


class IntegrityError(BadInput):
    """A build whose files, tensors or reload do not match build.json: refused, never served."""


def safetensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header without __metadata__, byte offset of the data section)."""
    header, _, base = read_safetensors_header(path)
    return header, base


def read_safetensors_header(path: Path) -> tuple[dict[str, Any], dict[str, str] | None, int]:
    """(tensor entries, __metadata__ or None, byte offset of the data section): the one parser of the format's
    header (8-byte little-endian length, then JSON), with a truncated or garbled file an IntegrityError."""
    size = path.stat().st_size
    with path.open("rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            raise IntegrityError(f"{path} is truncated (no safetensors header)", fix="rebuild it with --force")
        (n,) = struct.unpack("<Q", raw)
        if n > size - 8:
            raise IntegrityError(f"{path} is truncated (header of {n} bytes, file of {size})", fix="rebuild it with --force")
        try:
            header = json.loads(f.read(n))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise IntegrityError(f"{path} is not a valid safetensors file", fix="rebuild it with --force") from None
    meta = header.pop("__metadata__", None)
    return header, meta, 8 + n


def tensor_digests(path: Path) -> dict[str, str]:
    """tensor name -> sha256 of its bytes; IntegrityError if the file is shorter than its header says."""
    header, base = safetensors_header(path)
    size = path.stat().st_size
    out = {}
    with path.open("rb") as f:
        for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
            start, end = info["data_offsets"]
            if base + end > size:
                raise IntegrityError(f"{path.name} is truncated: tensor {name} ends at byte {base + end}, file has {size}",
                                     fix="rebuild it with --force")
            f.seek(base + start)
            h, left = hashlib.sha256(), end - start
            while left:
                chunk = f.read(min(_CHUNK, left))
                h.update(chunk)
                left -= len(chunk)
            out[name] = h.hexdigest()
    return dict(sorted(out.items()))


def _file_digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def hash_dir(root: Path, tensors_only: bool = False, known: dict[str, str] | None = None) -> dict[str, str]:
    """'relpath::tensor' -> sha256 for every file under root except build.json (sorted). `known`: digests of
    shards already hashed while they were written (streamcopy), taken as given instead of read again."""
    out: dict[str, str] = dict(known or {})
    done = {k.split("::", 1)[0] for k in out}
    for p in sorted(root.rglob("*")):
        if not p.is_file() or p.name == BUILD_MANIFEST or p.relative_to(root).as_posix() in done:
            continue
        rel = p.relative_to(root).as_posix()
        if p.suffix == ".safetensors":
            out.update({f"{rel}::{k}": v for k, v in tensor_digests(p).items()})
        elif not tensors_only:
            out[f"{rel}::{WHOLE_FILE}"] = _file_digest(p)
    return dict(sorted(out.items()))


def model_hash(model_dir: Path) -> tuple[str, dict[str, str]]:
    """Hash of a model's tensors only (its identity as a build input), and the per-tensor hashes."""
    files = sorted(model_dir.glob("*.safetensors"))
    digests = {f"{p.name}::{k}": v for p in files for k, v in tensor_digests(p).items()}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()[:16], digests


def bytes_by_dtype(root: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for p in sorted(root.rglob("*.safetensors")):
        header, _ = safetensors_header(p)
        for info in header.values():
            start, end = info["data_offsets"]
            out[info["dtype"]] = out.get(info["dtype"], 0) + end - start
    return dict(sorted(out.items()))


def kv_bytes_per_token(config: dict[str, Any], kv_dtype: str) -> int:
    """KV-cache bytes per token over all layers: MLA caches one latent + rope key per layer."""
    cfg = config.get("text_config", config)
    layers = int(cfg["num_hidden_layers"])
    width = 1 if kv_dtype.startswith("fp8") else {"float32": 4}.get(str(cfg.get("dtype") or cfg.get("torch_dtype")), 2)
    if cfg.get("kv_lora_rank"):
        return layers * (int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])) * width
    heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"])
    return 2 * layers * heads * head_dim * width


def module_counts(model) -> dict[str, list[int]]:
    """Quantized Linear modules and their parameters per scheme targets; 'kv' counts KV-quantized attention."""
    import torch

    out: dict[str, list[int]] = {"kv": [0, 0]}
    for _, m in model.named_modules():
        scheme = getattr(m, "quantization_scheme", None)
        if scheme is None:
            continue
        if isinstance(m, torch.nn.Linear):
            c = out.setdefault(json.dumps(list(scheme.targets)), [0, 0])
            c[0], c[1] = c[0] + 1, c[1] + m.weight.numel()
        elif hasattr(m, "kv_cache"):
            out["kv"][0] += 1
    return out


def quantization_summary(counts: dict[str, list[int]], quant_config: dict[str, Any] | None,
                         prefix: str = "") -> list[SchemeSummary]:
    """One entry per config group (modules, params, format) plus one for the KV cache.

    Counts come from the in-memory model after oneshot; scheme names and formats from the
    saved quantization_config, i.e. what serving engines will read.
    """
    from compressed_tensors.quantization.quant_scheme import PRESET_SCHEMES

    if not quant_config:
        return []
    out = []
    for gname, group in (quant_config.get("config_groups") or {}).items():
        n, params = counts.get(json.dumps(group["targets"]), [0, 0])
        out.append(SchemeSummary(scheme=prefix + _preset_name(group, PRESET_SCHEMES, gname), targets=group["targets"],
                                 modules=n, params=params, format=group.get("format") or quant_config.get("format")))
    kv = quant_config.get("kv_cache_scheme")
    if kv:
        name = f"kv_cache:{'fp8_e4m3' if kv['type'] == 'float' and kv['num_bits'] == 8 else kv['type'] + str(kv['num_bits'])}"
        out.append(SchemeSummary(scheme=prefix + name, targets=["attention"], modules=counts["kv"][0], params=0,
                                 format="static-scales"))
    return out


def applied_serving(serving: dict[str, Any], summary: list[SchemeSummary], shipped: bool) -> dict[str, Any]:
    """The recipe's serving metadata, less the weight formats that nothing in the build carries: build.json
    claims what was applied (a `scheme: null` build claimed NVFP4 weights and served as compressed-tensors)."""
    weights = [s for s in summary if s.modules and "kv_cache" not in s.scheme]
    out = dict(serving)
    if not (shipped or any(not s.scheme.startswith("drafter:") for s in weights)):
        out["weight_quantization"] = None
    if not any(s.scheme.startswith("drafter:") for s in weights) and out.get("draft_model_quantization"):
        out["draft_model_quantization"] = None
    return out


def _preset_name(group: dict[str, Any], presets: dict[str, dict], fallback: str) -> str:
    keys = ("num_bits", "type", "strategy", "group_size", "symmetric", "dynamic")

    def sig(args) -> tuple | None:
        if args is None:
            return None
        d = args if isinstance(args, dict) else args.model_dump()
        return tuple(str(d.get(k)) for k in keys)

    for name, p in presets.items():
        if sig(group.get("weights")) == sig(p.get("weights")) and sig(group.get("input_activations")) == sig(p.get("input_activations")):
            return name
    return fallback


def read_manifest(build_dir: Path) -> BuildManifest:
    path = manifest_path(build_dir)
    if not build_dir.is_dir():
        raise BadInput(f"build dir {build_dir} not found", fix="pass a directory listed by 'qverify builds'")
    if not path.is_file():
        raise IntegrityError(f"{build_dir} has no build.json: not a finished qverify build", fix="build it with 'qverify build'")
    try:
        return read_build_manifest(build_dir)
    except ValueError as e:
        raise IntegrityError(f"{path} is not a valid build manifest ({str(e).splitlines()[0]})", fix="rebuild it with --force") from None


def check_hashes(build_dir: Path, manifest: BuildManifest) -> int:
    """Compare every file/tensor to build.json; IntegrityError naming the first difference."""
    actual = hash_dir(build_dir)
    expected = manifest.tensor_hashes
    for key in expected:
        if key not in actual:
            raise IntegrityError(f"{build_dir.name}: {key} is listed in build.json but missing", fix="rebuild it with --force")
    for key in actual:
        if key not in expected:
            raise IntegrityError(f"{build_dir.name}: {key} is not in build.json (added after the build)", fix="rebuild it with --force")
        if actual[key] != expected[key]:
            raise IntegrityError(f"{build_dir.name}: {key} does not match its hash in build.json (tampered or corrupted)",
                                 fix="rebuild it with --force")
    return len(actual)
