"""Crash-safe results store: <workdir>/runs/<build-id>/<suite>/r<k>.jsonl + manifest.json.

Each r<k>.jsonl is append-only, one ItemResult per line, flushed and fsync'd in batches.
A torn last line (a kill mid-write) is ignored on read and truncated on the next append,
so resuming never loses a finished result nor duplicates one.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from qverify.models import ItemResult, RunManifest
from qverify.scrub import scrub_obj, secrets


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(path)


def _scrubbed_json(model) -> str:
    """A result or manifest as stored: no registered secret (an error body echoing the key), no URL userinfo."""
    text = model.model_dump_json()
    if secrets() or "@" in text:
        text = json.dumps(scrub_obj(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
    return text


def _read_results(path: Path) -> tuple[list[ItemResult], int]:
    """Valid results and the byte length of the valid prefix (where a torn tail starts)."""
    out: list[ItemResult] = []
    good = 0
    if not path.exists():
        return out, 0
    with open(path, "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break
            try:
                out.append(ItemResult.model_validate_json(line))
            except ValueError:
                break
            good += len(line)
    return out, good


@dataclass
class ReplicateWriter:
    path: Path
    fsync_every: int = 8
    _pending: int = 0
    _f: object = field(default=None, repr=False)

    def __enter__(self) -> "ReplicateWriter":
        _, good = _read_results(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "ab")
        self._f.truncate(good)  # drop a torn tail left by a kill
        return self

    def append(self, result: ItemResult) -> None:
        self._f.write(_scrubbed_json(result).encode() + b"\n")
        self._f.flush()
        self._pending += 1
        if self._pending >= self.fsync_every:
            os.fsync(self._f.fileno())
            self._pending = 0

    def __exit__(self, *exc: object) -> None:
        self._f.flush()
        os.fsync(self._f.fileno())
        self._f.close()


class RunStore:
    """The results of one (build, suite)."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir

    @property
    def manifest_path(self) -> Path:
        return self.dir / "manifest.json"

    def replicate_path(self, k: int) -> Path:
        return self.dir / f"r{k}.jsonl"

    def writer(self, k: int) -> ReplicateWriter:
        return ReplicateWriter(self.replicate_path(k))

    def read_manifest(self) -> RunManifest | None:
        if not self.manifest_path.exists():
            return None
        return RunManifest.model_validate_json(self.manifest_path.read_text())

    def write_manifest(self, m: RunManifest) -> None:
        atomic_write_text(self.manifest_path, json.dumps(json.loads(_scrubbed_json(m)), indent=2, ensure_ascii=False))

    def results(self, k: int) -> list[ItemResult]:
        """Results of replicate k, last write per item wins (a retried item replaces its error)."""
        rows, _ = _read_results(self.replicate_path(k))
        by_item: dict[str, ItemResult] = {}
        for r in rows:
            by_item[r.item_id] = r
        return list(by_item.values())

    def replicates(self) -> list[int]:
        return sorted(int(p.stem[1:]) for p in self.dir.glob("r*.jsonl") if p.stem[1:].isdigit())

    def all_results(self) -> dict[int, list[ItemResult]]:
        return {k: self.results(k) for k in self.replicates()}

    def done_ids(self, k: int) -> set[str]:
        """Items of replicate k that finished without an infrastructure error."""
        return {r.item_id for r in self.results(k) if r.error is None}


def load_run(runs_root: Path, build_id: str, suite: str) -> tuple[RunManifest | None, dict[int, list[ItemResult]]]:
    store = RunStore(runs_root / build_id / suite)
    return store.read_manifest(), store.all_results()


def dump_json(path: Path, obj: object) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, default=str))
