"""The default request budget of `qverify gate`: sized from the suites' tolerances, before any run.

Per gated metric with tolerance tol on a per-item difference bounded by `scale` (1 for rates, the cap
for a capped distance), the items a fixed design needs for P(FAIL | -2 tol) of 0.8 with FAIL tested
family-wise (Holm's first step: alpha / F over the build's F declared gated metrics) and so also
P(PASS | 0) of 0.8 (Miller 2024's MDE: n = ((z_{1-alpha/F} + z_{0.8}) sigma / tol)^2, sigma = SIGMA * scale),
times SEQ_INFLATION for spreading alpha over the looks, and at least EXACT_FLOOR ln(1/alpha) scale / tol,
what the exact bound needs when few items change (qverify.gate.betting: an unchanged build's bound is
about -ln(1/alpha)/n at best). A suite needs the most any of its metrics needs, in whole rounds of its
first look, at most MAX_ROUNDS. The plan is J = the most rounds any suite needs, for every suite (the
looks' information fractions j/J are common to all suites, qverify.gate.budget.Plan), so the budget is J
full rounds on every build; suites stop as soon as they are decided, so a gate rarely spends it all.
The verdict does not depend on the machine's speed. SIGMA and SEQ_INFLATION were read off
benchmarks/gate_oc.py's item models and whole budgeted gates (docs/gate.md, "Whole budgeted gates").
"""

from __future__ import annotations

import math

from scipy import stats as sps

from qverify.config import MetricRule

# per-item SD of d in units of its range: toolcall's item model fitted to the embedded suite's measured per-item
# variances (benchmarks/gate_oc_fitted.py: p ~ Beta(0.58, 0.29), within-item variance twice gate_oc's "noisy"
# model's) at Delta = -2 tol, 3 replicates, coupling 0.5, the worse of the two damages: concentrated (random items
# always wrong) 0.287; diffuse (every item's p scaled) 0.226, 0.186 at Delta = 0. Issue 35: sized on the diffuse
# 0.23 with at most 16 rounds, concentrated damage FAILed 0.65; the "noisy" model's 0.19 sized it before that
SIGMA = 0.29
SEQ_INFLATION = 1.25  # a group-sequential design (gamma 1, ~10 looks) needs ~1.25x the fixed design's items
EXACT_FLOOR = 2.0
MAX_ROUNDS = 24  # rounds of the first look: 24 x 60 = 1,440 items of a default-sized suite


def items_needed(tol: float, scale: float, alpha: float, family: int = 1) -> int:
    z = sps.norm.ppf(1 - alpha / max(family, 1)) + sps.norm.ppf(0.8)
    return math.ceil(max(SEQ_INFLATION * (z * SIGMA * scale / tol) ** 2, EXACT_FLOOR * math.log(1 / alpha) * scale / tol))


def suite_rounds(tolerances: list[tuple[float, float]], first: int, alpha: float, family: int = 1) -> int:
    """Rounds of `first` items one suite needs: (tolerance, scale) of each of its gated metrics."""
    need = max((items_needed(t, s, alpha, family) for t, s in tolerances if t > 0), default=first)
    return min(MAX_ROUNDS, max(1, math.ceil(need / first)))


def plan_rounds(suites: list[str], first: dict[str, int], alpha: float,
                rules: dict[str, MetricRule] | None = None) -> int:
    """J: the most rounds any suite needs, FAIL family-wise over every gated metric the suites declare (a family
    like longctx/accuracy@* counts once: it expands later). qverify.toml's [thresholds] apply as the gate applies
    them (qverify.gate.metrics.apply_rules): a metric the config ungates sizes nothing and leaves the family (the
    plan counted it before), a glob key and a tolerance of 0 count too."""
    from qverify.gate.metrics import apply_rules
    from qverify.suites import get_suite

    specs = {s: [r for r in (apply_rules(m, rules or {}) for m in get_suite(s).gate_metrics) if r.gated] for s in suites}
    family = sum(len(v) for v in specs.values())
    tols = {s: [(m.tolerance, m.cap or 1.0) for m in v] for s, v in specs.items()}
    return max((suite_rounds(tols[s], first[s], alpha, family) for s in suites), default=1)


def default_budget(suites: list[str], first: dict[str, int], replicates: int, n_builds: int, alpha: float,
                   rules: dict[str, MetricRule] | None = None) -> int:
    """Requests for J full rounds of every suite on every build (qverify.gate.budget.make_plan buys J looks)."""
    return plan_rounds(suites, first, alpha, rules) * sum(first[s] for s in suites) * replicates * n_builds
