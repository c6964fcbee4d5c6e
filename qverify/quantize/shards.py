"""Adding tensors to a saved checkpoint as extra shards, with the index every loader then follows.

A build adds tensors after llm-compressor has saved (the source's shipped INT4 experts, SGLang's KV scale).
Both transformers and SGLang read `model.safetensors.index.json` when it exists (SGLang drops shards the index
does not list), so the index is (re)written to list every tensor of every shard.
"""

from __future__ import annotations

import json
from pathlib import Path

from qverify.quantize.manifest import safetensors_header

INDEX = "model.safetensors.index.json"


def weight_map(build_dir: Path) -> dict[str, str]:
    index = build_dir / INDEX
    if index.is_file():
        return dict(json.loads(index.read_text())["weight_map"])
    return {n: p.name for p in sorted(build_dir.glob("*.safetensors")) for n in safetensors_header(p)[0]}


def add_shard(build_dir: Path, filename: str, tensors: dict) -> None:
    """Write `tensors` as a new shard (raw bytes as given) and list them in the index."""
    from safetensors.torch import save_file

    wmap = weight_map(build_dir)
    clash = sorted(set(tensors) & set(wmap))
    if clash:
        raise ValueError(f"{clash[0]} is already in {wmap[clash[0]]}")
    save_file(tensors, build_dir / filename, metadata={"format": "pt"})
    wmap.update(dict.fromkeys(tensors, filename))
    total = sum(p.stat().st_size for p in build_dir.glob("*.safetensors"))
    (build_dir / INDEX).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": dict(sorted(wmap.items()))},
                                              indent=2) + "\n")
