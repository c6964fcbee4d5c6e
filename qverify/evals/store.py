"""Crash-safe results store: <workdir>/runs/<build-id>/<suite>/r<k>.jsonl + manifest.json.

Each r<k>.jsonl is append-only, one ItemResult per line, flushed and fsync'd in batches.
A torn last line (a kill mid-write: no newline) is ignored on read and truncated on the next
append, so resuming never loses a finished result nor duplicates one. Any other line that is
not a result (a disk or an editor damaged it) is skipped on read, and moved to
r<k>.quarantine.jsonl with a warning on the next append: the results after it are kept.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Self

from qverify.errors import BadInput, refuse_special_files
from qverify.models import ItemResult, RunManifest
from qverify.scrub import scrub_obj, secrets
from qverify.workdir import open_nofollow, run_path

log = logging.getLogger(__name__)


def atomic_write_text(path: Path, text: str, mode: int | None = None) -> None:
    """Write-then-rename; the temp name is unique, so two writers never write into one temp file. The rename
    replaces a symlink at `path` instead of writing through it. `mode`: the file's permission bits (else 0o666
    as open() uses, the umask applies, not mkstemp's 0600: a manifest stays readable as before)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666 if mode is None else mode)
    try:
        if mode is not None:
            os.fchmod(fd, mode)  # exactly the source's bits, whatever the umask
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _scrubbed_json(model) -> str:
    """A result or manifest as stored: no registered secret (an error body echoing the key), no URL userinfo."""
    text = model.model_dump_json()
    if secrets() or "@" in text:
        text = json.dumps(scrub_obj(json.loads(text)), ensure_ascii=False, separators=(",", ":"))
    return text


_RUN_FILE_FIX = "remove it; the run's results are files written by `qverify eval`"


def _scan(path: Path) -> tuple[list[ItemResult], list[bytes], list[bytes], int]:
    """Valid results, their lines, the complete lines that are not results, and where a torn tail starts."""
    out: list[ItemResult] = []
    good: list[bytes] = []
    bad: list[bytes] = []
    end = 0
    if not path.exists():
        return out, good, bad, 0
    refuse_special_files([path], "run file", fix=_RUN_FILE_FIX)
    with os.fdopen(open_nofollow(path), "rb") as f:
        for line in f:
            if not line.endswith(b"\n"):
                break  # only the last line can lack its newline: a write cut short
            end += len(line)
            try:
                out.append(ItemResult.model_validate_json(line))
                good.append(line)
            except ValueError:
                bad.append(line)
    return out, good, bad, end


def _read_results(path: Path) -> list[ItemResult]:
    rows, _, bad, _ = _scan(path)
    if bad:
        log.warning("%s: skipped %d line(s) that are not results (they are quarantined on the next eval)", path, len(bad))
    return rows


def quarantine_path(path: Path) -> Path:
    return path.with_name(path.stem + ".quarantine.jsonl")


@dataclass
class ReplicateWriter:
    path: Path
    fsync_every: int = 8
    _pending: int = 0
    _f: object = field(default=None, repr=False)
    quarantined: int = 0  # lines moved to quarantine_path on open

    def __enter__(self) -> Self:
        _, good, bad, end = _scan(self.path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        append = os.O_WRONLY | os.O_APPEND | os.O_CREAT
        if bad:
            # keep the bad lines for a post-mortem, and every valid result (before and after them); both files
            # keep the source's permissions (a 0600 file's lines went into a world-readable quarantine)
            mode = stat.S_IMODE(os.lstat(self.path).st_mode)
            with os.fdopen(open_nofollow(quarantine_path(self.path), append, mode), "ab") as q:
                os.fchmod(q.fileno(), mode)
                q.writelines(bad)
                q.flush()
                os.fsync(q.fileno())
            atomic_write_text(self.path, b"".join(good).decode(), mode)
            end, self.quarantined = self.path.stat().st_size, len(bad)
        self._f = os.fdopen(open_nofollow(self.path, append), "ab")
        self._f.truncate(end)  # drop a torn tail left by a kill
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
        refuse_special_files([self.manifest_path], "run file", fix=_RUN_FILE_FIX)
        try:
            with os.fdopen(open_nofollow(self.manifest_path), "rb") as f:
                return RunManifest.model_validate_json(f.read())
        except ValueError as e:  # a damaged file is the user's to fix, not a bug: name it and the way out
            first = str(e).splitlines()[1] if len(str(e).splitlines()) > 1 else str(e)
            raise BadInput(f"{self.manifest_path} is not a valid run manifest ({first.strip()[:80]})",
                           fix=f"delete it and rerun the same `qverify eval` (its results are kept and the manifest "
                               f"is rewritten), or `qverify eval ... --suites {self.dir.name} --fresh` to start over") from None

    def write_manifest(self, m: RunManifest) -> None:
        atomic_write_text(self.manifest_path, json.dumps(json.loads(_scrubbed_json(m)), indent=2, ensure_ascii=False))

    def results(self, k: int) -> list[ItemResult]:
        """Results of replicate k, last write per item wins (a retried item replaces its error)."""
        rows = _read_results(self.replicate_path(k))
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
    store = RunStore(run_path(runs_root, build_id, suite))
    return store.read_manifest(), store.all_results()
