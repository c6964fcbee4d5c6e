"""Runs as the gate sees them: per score key an items x replicates matrix (NaN = no value).

The only I/O in the gate's data path; everything downstream is pure.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from qverify.errors import refuse_special_files
from qverify.evals.store import RunStore
from qverify.gate.metrics import specs_for_suite
from qverify.gate.pairwise import output_signature
from qverify.models import ItemResult, RunManifest
from qverify.workdir import run_path


@dataclass
class RunData:
    build_id: str
    suite: str
    manifest: RunManifest | None
    items: list[str]  # every item id that has a result in any replicate, sorted
    replicates: list[int]
    scores: dict[str, np.ndarray]  # key -> len(items) x len(replicates); NaN: error, missing, or key not emitted
    logprobs: list[list[Any]] | None = None  # kld: [item][replicate] -> per-token logprobs or None
    outputs: list[list[str | None]] | None = None  # greedy: [item][replicate] -> output signature or None
    n_results: int = 0  # (item, replicate) results read
    n_errors: int = 0  # of those, infrastructure errors (never scored)
    n_length: int = 0  # of those, answers that ended on finish_reason == "length" (cut at max_tokens)
    fingerprint: str = ""  # hash of manifest + result files: a changed run gets a new gate id
    extra: dict[str, Any] = field(default_factory=dict)
    errored: np.ndarray | None = None  # len(items) x len(replicates): True where the request errored or has no result

    @property
    def exists(self) -> bool:
        return self.manifest is not None or bool(self.replicates)

    def matrix(self, key: str, items: list[str]) -> np.ndarray:
        """Rows for `items` in that order (all NaN for an item this run lacks)."""
        src = self.scores.get(key)
        out = np.full((len(items), len(self.replicates)), np.nan)
        if src is None:
            return out
        pos = {i: r for r, i in enumerate(self.items)}
        for r, item in enumerate(items):
            if item in pos:
                out[r] = src[pos[item]]
        return out

    def error_rows(self, items: list[str]) -> np.ndarray:
        """True where item x replicate has no answered request (an error, or no result): qverify.gate.errored."""
        out = np.zeros((len(items), len(self.replicates)), bool)
        if self.errored is None:
            return out
        pos = {i: r for r, i in enumerate(self.items)}
        for r, item in enumerate(items):
            if item in pos:
                out[r] = self.errored[pos[item]]
        return out

    def output_rows(self, items: list[str]) -> list[list[str | None]]:
        pos = {i: r for r, i in enumerate(self.items)}
        k = len(self.replicates)
        return [self.outputs[pos[i]] if self.outputs and i in pos else [None] * k for i in items]

    def logprob_rows(self, items: list[str]) -> list[list[Any]]:
        pos = {i: r for r, i in enumerate(self.items)}
        k = len(self.replicates)
        return [self.logprobs[pos[i]] if self.logprobs and i in pos else [None] * k for i in items]


def from_results(build_id: str, suite: str, manifest: RunManifest | None, results: dict[int, list[ItemResult]],
                 keep_logprobs: bool = False, keep_outputs: bool = False) -> RunData:
    reps = sorted(results)
    items = sorted({r.item_id for rs in results.values() for r in rs})
    pos = {i: n for n, i in enumerate(items)}
    scores: dict[str, np.ndarray] = {}
    lps: list[list[Any]] | None = [[None] * len(reps) for _ in items] if keep_logprobs else None
    outs: list[list[str | None]] | None = [[None] * len(reps) for _ in items] if keep_outputs else None
    n_res = n_err = n_len = 0
    errored = np.ones((len(items), len(reps)), bool)
    for col, k in enumerate(reps):
        for r in results[k]:
            n_res += 1
            if r.error is not None:
                n_err += 1
                continue
            row = pos[r.item_id]
            errored[row, col] = False
            n_len += r.response is not None and r.response.finish_reason == "length"
            for key, v in r.scores.items():
                if key not in scores:
                    scores[key] = np.full((len(items), len(reps)), np.nan)
                scores[key][row, col] = float(v)
            if lps is not None and r.response is not None and r.response.logprobs:
                lps[row][col] = r.response.logprobs
            if outs is not None:
                outs[row][col] = output_signature(r.response)
    return RunData(build_id, suite, manifest, items, reps, scores, lps, outs, n_res, n_err, n_len, errored=errored)


def load(runs_root: Path, build_id: str, suite: str) -> RunData:
    store = RunStore(run_path(runs_root, build_id, suite))
    statistics = {s.statistic for s in specs_for_suite(suite)}  # what the suite's gate metrics are computed from
    data = from_results(build_id, suite, store.read_manifest(), store.all_results(), keep_logprobs="kld" in statistics,
                        keep_outputs="match" in statistics)
    data.fingerprint = _fingerprint(store)
    return data


def has_run(runs_root: Path, build_id: str, suite: str) -> bool:
    """What RunData.exists says, without reading the results."""
    store = RunStore(run_path(runs_root, build_id, suite))
    return store.manifest_path.exists() or bool(store.replicates())


def fingerprint(runs_root: Path, build_id: str, suite: str) -> str:
    """A run's content hash without reading its results into memory (qverify.gate.ledger's fixed-gate key)."""
    return _fingerprint(RunStore(run_path(runs_root, build_id, suite)))


def _fingerprint(store: RunStore) -> str:
    h = hashlib.sha256()
    files = sorted([store.manifest_path, *store.dir.glob("r*.jsonl")])
    # a FIFO would block the read forever: refused first, as every read of a run is (qverify.evals.store)
    refuse_special_files([p for p in files if p.exists()], "run file",
                         fix=f"remove it and rerun `qverify eval {store.dir.parent.name} --suites {store.dir.name}`")
    for p in files:
        if p.exists():
            h.update(p.name.encode())
            with open(p, "rb") as f:
                for chunk in iter(lambda: f.read(1 << 20), b""):
                    h.update(chunk)
    return h.hexdigest()[:16]
