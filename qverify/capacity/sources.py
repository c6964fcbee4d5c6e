"""Where a plan's inputs come from: a build directory on disk, or a config.json plus a recipe."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from qverify.capacity.quantplan import QuantPlan
from qverify.capacity.weights import WeightsEstimate, checkpoint_weights
from qverify.errors import BadInput
from qverify.models import BuildManifest
from qverify.workdir import BUILD_MANIFEST

CONFIGS_DIR = Path(__file__).resolve().parent / "configs"


def shipped_configs() -> list[str]:
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.json"))


def read_json(path: Path, what: str) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInput(f"{what} {path} does not exist", fix="check the path") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadInput(f"{what} {path} is not valid JSON ({e})", fix="pass a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise BadInput(f"{what} {path} is not a JSON object", fix="pass a Hugging Face config.json")
    return data


def load_config(arg: str) -> tuple[dict[str, Any], str]:
    """--config: a config.json path, a model directory, or a shipped name such as kimi-k2.6."""
    p = Path(arg)
    if p.is_dir():
        p = p / "config.json"
    elif not p.exists() and (CONFIGS_DIR / f"{arg}.json").is_file():
        p = CONFIGS_DIR / f"{arg}.json"
    elif not p.exists():
        raise BadInput(f"config {arg!r} is neither a file nor a shipped config",
                       fix=f"pass a config.json path or one of: {', '.join(shipped_configs())}")
    cfg = read_json(p, "config")
    fallback = p.stem if p.parent == CONFIGS_DIR else p.parent.name
    return cfg, str(cfg.get("_name_or_path") or fallback)


def _kv_dtype(declared: str, config: dict[str, Any]) -> str:
    declared = declared.lower()
    if declared:
        return "fp8" if "fp8" in declared or "e4m3" in declared else "bf16"
    kv = (config.get("quantization_config") or {}).get("kv_cache_scheme") or {}
    return "fp8" if kv.get("num_bits") == 8 else "bf16"


@dataclass
class BuildInputs:
    config: dict[str, Any]
    weights: WeightsEstimate
    quant: QuantPlan
    name: str
    drafter_config: dict[str, Any] | None = None
    drafter_weights: WeightsEstimate | None = None


def load_build(d: Path, manifest: BuildManifest | None) -> BuildInputs:
    """A resolved build directory (qverify.workdir.Workdir.resolve_build) with its manifest, or a Hugging Face
    checkpoint directory (manifest None)."""
    if not (d / "config.json").is_file():
        raise BadInput(f"{d} has no config.json", fix="pass a build or Hugging Face checkpoint directory")
    config = read_json(d / "config.json", "config")
    recipe = manifest.recipe if manifest else "checkpoint"
    source = BUILD_MANIFEST if manifest else "config.json quantization_config"
    kv = manifest.kv_dtype if manifest else ""
    quant = QuantPlan(name=recipe, kv_dtype=_kv_dtype(kv, config), source=source)
    draft = d / "drafter"
    has_drafter = (draft / "config.json").is_file()
    return BuildInputs(
        config=config, weights=checkpoint_weights(d), quant=quant, name=manifest.build_id if manifest else d.name,
        drafter_config=read_json(draft / "config.json", "drafter config") if has_drafter else None,
        drafter_weights=checkpoint_weights(draft) if has_drafter else None,
    )


def parse_context(text: str) -> int:
    """'100k' -> 100000, '1m' / '1M' -> 1000000, '32768' -> 32768 (k and M are decimal)."""
    t = text.strip().lower().replace("_", "").replace(",", "")
    scale = {"k": 10**3, "m": 10**6}.get(t[-1:], 1)
    try:
        n = float(t[:-1] if scale > 1 else t) * scale
    except ValueError:
        raise BadInput(f"--context {text!r} is not a token count", fix="e.g. --context 100k, 1m or 32768") from None
    if n < 1:
        raise BadInput(f"--context must be at least 1 token, got {text!r}", fix="e.g. --context 100k")
    return int(n)
