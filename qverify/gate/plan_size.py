"""The default request budget of `qverify gate`: sized from the suites' tolerances, before any run.

Per gated metric with tolerance tol on a per-item difference bounded by `scale` (1 for rates, the cap
for a capped distance), the items a fixed design needs for P(PASS | 0) and P(FAIL | -2 tol) of 0.8
(Miller 2024's MDE: n = ((z_{1-alpha} + z_{0.8}) sigma / tol)^2), with sigma = SIGMA * scale, and at
least EXACT_FLOOR ln(1/alpha) scale / tol, what the exact bound needs when few items change
(qverify.gate.betting: an unchanged build's bound is about -ln(1/alpha)/n at best). A suite gets the
most any of its metrics needs, rounded up to whole rounds of its first look and capped at
MAX_ROUNDS rounds (a suite that needs more is left to the report's advice). The budget is the
requests of those rounds on every build, so the verdict does not depend on the machine's speed.
SIGMA and EXACT_FLOOR were read off benchmarks/gate_oc.py's item models (docs/gate.md).
"""

from __future__ import annotations

import math

from scipy import stats as sps

SIGMA = 0.35  # per-item SD of d in units of its range: a noisy 0/1 suite at 3 replicates, coupling 0
EXACT_FLOOR = 2.0
MAX_ROUNDS = 4


def items_needed(tol: float, scale: float, alpha: float) -> int:
    z = sps.norm.ppf(1 - alpha) + sps.norm.ppf(0.8)
    return math.ceil(max((z * SIGMA * scale / tol) ** 2, EXACT_FLOOR * math.log(1 / alpha) * scale / tol))


def suite_items(tolerances: list[tuple[float, float]], first: int, alpha: float) -> int:
    """Items for one suite: (tolerance, scale) of each of its gated metrics, its first look's items."""
    need = max((items_needed(t, s, alpha) for t, s in tolerances if t > 0), default=first)
    return first * min(MAX_ROUNDS, max(1, math.ceil(need / first)))


def default_budget(suites: list[str], first: dict[str, int], replicates: int, n_builds: int, alpha: float,
                   overrides: dict[str, float | None] | None = None) -> int:
    """Requests for every build to reach each suite's items (suites' own gate_metrics; config tolerances win)."""
    from qverify.suites import get_suite

    total = 0
    for s in suites:
        specs = [m for m in get_suite(s).gate_metrics if m.gated]
        tols = [((overrides or {}).get(m.name) or m.tolerance, m.cap or 1.0) for m in specs]
        total += suite_items(tols, first[s], alpha) * replicates * n_builds
    return total
