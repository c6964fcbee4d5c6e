"""Items that flipped between baseline and candidate (Dutta et al. 2024: equal accuracy can hide flips).

A flip is an item correct in every baseline replicate and wrong in every candidate
replicate (regressed), or the reverse (improved) — the same definition the gate counts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from qverify.gate.pairwise import flip_direction, is_binary
from qverify.models import ItemResult
from qverify.reports.bundle import GateBundle, SuiteRun


@dataclass
class Flip:
    suite: str
    item_id: str
    metric: str
    direction: Literal["regressed", "improved"]
    baseline: ItemResult
    candidate: ItemResult


def _primary(suite: str) -> str | None:
    try:
        from qverify.suites import get_suite

        return get_suite(suite).primary_metric
    except Exception:  # noqa: BLE001 - an unknown or renamed suite just falls back to the data
        return None


def binary_metric(suite: str, runs: list[SuiteRun]) -> str | None:
    """The suite's primary metric if it is 0/1 per item, else the first 0/1 score, else None (kld)."""
    values: dict[str, set[float]] = {}
    for run in runs:
        for rs in run.results.values():
            for r in rs:
                for k, v in r.scores.items():
                    values.setdefault(k, set()).add(float(v))
    binary = [k for k, vs in values.items() if is_binary(np.array(sorted(vs))) and "@" not in k]
    prim = _primary(suite)
    if prim in binary:
        return prim
    return binary[0] if binary else None


def _scored(rs: list[ItemResult], metric: str) -> list[ItemResult]:
    return [r for r in rs if r.error is None and metric in r.scores]


def flipped(bundle: GateBundle, cand_id: str, limit: int = 6) -> list[Flip]:
    """Regressions first (they decide releases), then improvements; at most `limit`."""
    out: list[Flip] = []
    for suite in bundle.suites:
        base = bundle.runs.get((bundle.gate.baseline, suite))
        cand = bundle.runs.get((cand_id, suite))
        if base is None or cand is None:
            continue
        metric = binary_metric(suite, [base, cand])
        if metric is None:
            continue
        b_items, c_items = base.by_item(), cand.by_item()
        for item_id in sorted(set(b_items) & set(c_items)):
            b, c = _scored(b_items[item_id], metric), _scored(c_items[item_id], metric)
            if not b or not c:
                continue
            direction = flip_direction([r.scores[metric] for r in b], [r.scores[metric] for r in c])
            if direction is not None:
                out.append(Flip(suite, item_id, metric, direction, b[0], c[0]))
    # regressions first, taking each suite in turn so one suite cannot fill the page
    by_suite: dict[tuple[str, str], list[Flip]] = {}
    for f in out:
        by_suite.setdefault((f.direction, f.suite), []).append(f)
    ordered: list[Flip] = []
    for direction in ("regressed", "improved"):
        queues = [q for (d, _), q in by_suite.items() if d == direction]
        while any(queues):
            ordered += [q.pop(0) for q in queues if q]
    return ordered[:limit]


def response_text(r: ItemResult, limit: int = 1500) -> str:
    """What the model said, tool calls included, as a reviewer would read it."""
    if r.response is None:
        return f"(no response: {r.error})" if r.error else "(no response)"
    parts = []
    if r.response.content:
        parts.append(r.response.content)
    for t in r.response.tool_calls:
        parts.append(f"→ {t.name}({t.arguments})")
    text = "\n".join(parts) or "(empty)"
    return text if len(text) <= limit else text[:limit] + " …"
