"""Which gate reports were budgeted (sequential levels). Every later gate of the same runs spends only the alpha
the earlier ones left, whatever its route: qverify.gate.ledger, which replaced the search of gates/ for earlier
fixed gates (issue 29) with looks recorded beside the runs (issue 35)."""

from __future__ import annotations

from qverify.models import GateReport


def budgeted(report: GateReport) -> bool:
    """A gate whose looks had sequential levels (a fixed gate is a plan of one look with no budget)."""
    plan = (report.config.get("sequential") or {}).get("plan", {})
    return plan.get("budget_requests") is not None or plan.get("budget_seconds") is not None
