"""The source side of a build: what counts as a model dir, and carrying its files byte for byte.

A build keeps every non-weight file of its source (Kimi's `tiktoken.model`, `tokenization_kimi.py`, chat
template, README, ...): the serving engine loads the tokenizer from the build dir, not from the source.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from qverify.errors import BadInput

_TOKENIZER_PREFIXES = ("tokenizer", "special_tokens_map", "chat_template", "added_tokens", "vocab", "merges")


def check_model_dir(path: Path, what: str, default: bool = False, allow_quantized: bool = False) -> Path:
    """A local Hugging Face model dir: config.json with a model_type, *.safetensors; unquantized unless
    `allow_quantized` (a compressed-tensors release whose quantized modules a build keeps as shipped)."""
    if not path.is_dir():
        if default:
            raise BadInput(f"the embedded model qverify-tiny is not installed at {path}",
                           fix="pass --model DIR, or train it with scripts/train_reference_model.py")
        raise BadInput(f"{what} dir {path} not found", fix=f"pass --{what} DIR with a Hugging Face model")
    try:
        config = json.loads((path / "config.json").read_text())
        assert isinstance(config, dict) and config.get("model_type")
    except (OSError, ValueError, AssertionError):
        raise BadInput(f"{path} is not a Hugging Face model dir (no valid config.json with model_type)",
                       fix=f"pass --{what} DIR containing config.json and *.safetensors") from None
    if not list(path.glob("*.safetensors")):
        raise BadInput(f"{path} is not a Hugging Face model dir (no *.safetensors weights)",
                       fix=f"pass --{what} DIR containing config.json and *.safetensors")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "tiktoken.model")
    if what == "model" and not any((path / f).is_file() for f in tokenizer_files):
        raise BadInput(f"{path} has no tokenizer files", fix="save the tokenizer next to the model (tokenizer.save_pretrained)")
    if config.get("quantization_config") and not allow_quantized:
        raise BadInput(f"{path} is already quantized", fix=f"pass the unquantized {what} (e.g. a bf16 build's source)")
    from qverify.quantize.shapes import check_shapes

    check_shapes(path)  # a config.json that lies about shapes is the source's fault: say so before building
    return path.resolve()


def needs_remote_code(path: Path) -> bool:
    """True when the model or its tokenizer is only reachable through `auto_map` (Kimi's tokenization_kimi.py)."""
    for name in ("config.json", "tokenizer_config.json"):
        try:
            if json.loads((path / name).read_text()).get("auto_map"):
                return True
        except (OSError, ValueError):
            continue
    return False


def copy_model(src: Path, dst: Path) -> list[str]:
    """Every file of the source byte for byte (subdirectories such as drafter/ are their own stage); returns
    the non-weight ones."""
    dst.mkdir(parents=True, exist_ok=True)
    for p in sorted(src.iterdir()):
        if p.is_file() and not p.name.startswith("."):
            shutil.copy2(p, dst / p.name)
    return [p.name for p in sorted(src.iterdir()) if p.is_file() and not p.name.startswith(".") and not is_weight(p.name)]


def is_weight(name: str) -> bool:
    return name.endswith((".safetensors", ".safetensors.index.json", ".bin"))


_DOCS = (".md", ".gitattributes")  # carried, but they change nothing that is served
_DOC_PREFIXES = ("LICENSE", "NOTICE")


def files_hash(model_dir: Path | None) -> str | None:
    """Hash of every non-weight file a build carries and serves from (config.json's rope scaling,
    generation_config.json, chat template, tokenizer files, remote code; docs excepted), by name and bytes.
    Part of the build key with the tensors': two sources with the same weights but another of these
    files serve differently, so they must not share a build id."""
    if model_dir is None:
        return None
    import hashlib

    h = hashlib.sha256()
    for p in sorted(model_dir.iterdir()):
        if (not p.is_file() or p.name.startswith(".") or is_weight(p.name) or p.name.endswith(_DOCS)
                or p.name.startswith(_DOC_PREFIXES)):
            continue
        h.update(p.name.encode() + b"\0" + hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()[:16]


def carry_files(src: Path, dst: Path) -> list[str]:
    """Copy every non-weight file of the source that the saved build does not already have (tokenizer,
    `tiktoken.model`, `tokenization_*.py`, chat template, README, ...); returns their names."""
    carried = []
    for p in sorted(src.iterdir()):
        if not p.is_file() or p.name.startswith(".") or is_weight(p.name):
            continue
        if not (dst / p.name).exists():
            shutil.copy2(p, dst / p.name)
            carried.append(p.name)
    return carried


def copy_tokenizer(src: Path, fallback: Path, dst: Path) -> None:
    """A drafter without tokenizer files gets the target's (copied byte for byte)."""
    files = [p for p in sorted(src.iterdir()) if p.is_file() and p.name.startswith(_TOKENIZER_PREFIXES)]
    if not files and src != fallback:
        return copy_tokenizer(fallback, fallback, dst)
    dst.mkdir(parents=True, exist_ok=True)
    for p in files:
        shutil.copy2(p, dst / p.name)
