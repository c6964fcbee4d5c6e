"""A fixed gate on runs that grew since an earlier fixed gate of the same builds is a second look.

Gating the grown runs again at full alpha after an INCONCLUSIVE verdict is optional stopping:
the chance of a false PASS at Delta = -tol over the two looks is above alpha (measured 0.058 ->
0.079, issue 29; a Brownian motion looked at twice crosses a fixed boundary more often than once,
Armitage, McPherson & Rowe 1969). So such a gate is refused and pointed at the budgeted gate,
whose looks are planned with group-sequential levels (qverify.gate.boundaries).
"""

from __future__ import annotations

import json

from qverify.models import GateReport
from qverify.workdir import Workdir


def _items(report: GateReport) -> dict[tuple[str, str], int]:
    """(candidate, gated metric) -> paired items of a decided or undecided metric."""
    return {(c.build_id, m.metric): m.n_items for c in report.candidates for m in c.metrics if m.gated}


def budgeted(report: GateReport) -> bool:
    """A gate whose looks had sequential levels (a fixed gate is a plan of one look with no budget)."""
    plan = (report.config.get("sequential") or {}).get("plan", {})
    return plan.get("budget_requests") is not None or plan.get("budget_seconds") is not None


def earlier_looks(wd: Workdir, report: GateReport) -> list[str]:
    """Earlier fixed gates of this baseline that left a candidate INCONCLUSIVE on fewer items of a metric this
    report measures on more: each is named with the metric and the item counts."""
    now = _items(report)
    out = []
    for gate_id in wd.gate_ids():
        try:
            old = GateReport.model_validate(json.loads(wd.gate_report_path(gate_id).read_text()))
        except (OSError, ValueError):
            continue
        if old.gate_id == report.gate_id or old.baseline != report.baseline or budgeted(old):
            continue
        undecided = {c.build_id for c in old.candidates if c.verdict == "INCONCLUSIVE"}
        for (cand, metric), n in _items(old).items():
            if cand in undecided and now.get((cand, metric), 0) > n:
                out.append(f"gate {old.gate_id} left {cand} INCONCLUSIVE with {metric} on {n} items; "
                           f"these runs have {now[(cand, metric)]}")
                break
    return out
