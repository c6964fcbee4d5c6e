"""Copy safetensors shards as raw bytes, hashing each tensor as it passes (the source is read once for both).

A shard is copied byte for byte when every tensor is kept; otherwise it is rewritten with the kept tensors' bytes
unchanged and a new header. Either way memory stays at one chunk, and each tensor's sha256 (the same digest as
`manifest.tensor_digests`) is checked against the source's own digests taken at resolve, so a source that changed
under the build, or a bad read, is caught while copying.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path

from qverify.quantize.manifest import _CHUNK, IntegrityError, read_safetensors_header

Progress = Callable[[str], None]


def _copy_range(src, dst, length: int, h) -> None:
    while length:
        chunk = src.read(min(_CHUNK, length))
        if not chunk:
            raise IntegrityError(f"{src.name} ended early", fix="check the source checkpoint")
        h.update(chunk)
        dst.write(chunk)
        length -= len(chunk)


def copy_shard(src: Path, dst: Path, drop: set[str] = frozenset(), expect: dict[str, str] | None = None) -> dict[str, str]:
    """Copy `src` to `dst` without the tensors in `drop`; returns {tensor: sha256} of what was written.
    `expect` ({tensor: sha256} of the source) is checked tensor by tensor."""
    header, meta, base = read_safetensors_header(src)
    order = sorted(header, key=lambda k: header[k]["data_offsets"][0])
    kept = [k for k in order if k not in drop]
    digests: dict[str, str] = {}
    if not kept:  # every tensor replaced by the recipe: no shard to write
        return digests
    with src.open("rb") as fin, dst.open("wb") as fout:
        if len(kept) == len(order):  # byte for byte, header included
            fout.write(fin.read(base))
            pos = 0
            for k in order:
                start, end = header[k]["data_offsets"]
                if start > pos:  # padding between tensors: copied, not hashed
                    fout.write(fin.read(start - pos))
                digests[k] = _hashed(fin, fout, end - start)
                pos = end
            fout.write(fin.read())
        else:
            new, off = {}, 0
            for k in kept:
                start, end = header[k]["data_offsets"]
                new[k] = {"dtype": header[k]["dtype"], "shape": header[k]["shape"], "data_offsets": [off, off + end - start]}
                off += end - start
            body = json.dumps(({"__metadata__": meta} if meta else {}) | new, separators=(",", ":")).encode()
            body += b" " * (-len(body) % 8)  # safetensors aligns the data section to 8 bytes
            fout.write(struct.pack("<Q", len(body)) + body)
            for k in kept:
                start, end = header[k]["data_offsets"]
                fin.seek(base + start)
                digests[k] = _hashed(fin, fout, end - start)
    for k, d in digests.items():
        if expect is not None and expect.get(k) != d:
            raise IntegrityError(f"{src.name}: tensor {k} changed while the build read it",
                                 fix="do not modify the source during a build; run it again")
    return digests


def _hashed(fin, fout, length: int) -> str:
    h = hashlib.sha256()
    _copy_range(fin, fout, length, h)
    return h.hexdigest()


def copy_shards(src_dir: Path, dst_dir: Path, drop: set[str], expect: dict[str, str],
                progress: Progress | None = None) -> dict[str, str]:
    """Every source shard into `dst_dir` under its own name (minus `drop`); returns {'shard::tensor': sha256}.
    `expect` is the source's {'shard::tensor': sha256} (manifest.model_hash)."""
    shards = sorted(src_dir.glob("*.safetensors"))
    total, done, out = sum(p.stat().st_size for p in shards), 0, {}
    for i, p in enumerate(shards, 1):
        if progress:
            progress(f"copy: shard {i} of {len(shards)} ({done / 1e9:.2f} of {total / 1e9:.2f} GB)")
        mine = {k.split("::", 1)[1]: v for k, v in expect.items() if k.split("::", 1)[0] == p.name}
        digests = copy_shard(p, dst_dir / p.name, drop, mine)
        out |= {f"{p.name}::{k}": v for k, v in digests.items()}
        done += p.stat().st_size
    return out
