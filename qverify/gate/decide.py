"""Decisions (qverify.gate.rule) as the report's MetricResult rows.

ci_low / ci_high are the one-sided (1 - alpha) bounds, in the metric's own direction (so
together a 1 - 2 alpha interval); noise_band carries the baseline's run-to-run SD of one
run's mean (a report, never part of an acceptance region); mde is what the rule's own bound
could detect at power 0.8 (Miller 2024: MDE ~ (q_{1-alpha} + q_{0.8}) SE):

* t bound: (t_{1-alpha, df} + t_{0.8, df}) SE, df the rule's own (Satterthwaite's, from the
  kurtosis: bounds._hall), not n - 1 and a normal z, which understate it for mostly-zero d;
* exact (betting) bound: (Delta - L) + z_{0.8} SE, the realised reach of the bound below the
  estimate plus the power margin.

needed_items scales it to the tolerance (SE ~ 1/sqrt n). The advice never invites gating grown
runs again at full alpha (optional stopping: false PASS at -tol 0.058 -> 0.079, issue 29); it names
the budgeted sequential gate, whose looks are planned with group-sequential levels.
"""

from __future__ import annotations

import math
from typing import Any

from scipy import stats as sps

from qverify.gate.bounds import Bounds
from qverify.gate.rule import ORDER, Decision, build_verdict
from qverify.models import MetricResult

__all__ = ["ORDER", "build_verdict", "mde_of", "needed_items", "result"]
POWER = 0.8


def mde_of(b: Bounds, alpha: float) -> float:
    """The rule's own MDE at power POWER (module docstring)."""
    se = float(b.se)
    if not math.isfinite(se):
        return math.nan
    if bool(b.exact):
        return float(b.delta) - float(b.lower) + sps.norm.ppf(POWER) * se
    df = float(b.df) if math.isfinite(float(b.df)) else max(b.n - 1, 1)
    return float((sps.t.ppf(1 - alpha, df) + sps.t.ppf(POWER, df)) * se)


def needed_items(n: int, mde: float, tol: float) -> int | None:
    """Items (at the same replicates) for an MDE of `tol`: the MDE shrinks as 1/sqrt(n)."""
    if not (mde > 0 and tol > 0 and n > 1 and math.isfinite(mde)):
        return None
    return max(n, math.ceil(n * (mde / tol) ** 2))


def result(dc: Decision, alpha: float) -> MetricResult:
    ev, b = dc.evidence, dc.bounds
    det: dict[str, Any] = dict(ev.details)
    summary = {k: det.pop(k, None) for k in ("baseline_mean", "candidate_mean", "baseline_spread", "candidate_spread")}
    flips = det.pop("flips", {})
    delta = lo = hi = se = mde = 0.0
    p = None
    advice = None
    if b is not None:
        s = ev.sign
        delta, se = s * float(b.delta), float(b.se)
        lo, hi = (float(b.lower), float(b.upper)) if s > 0 else (-float(b.upper), -float(b.lower))
        mde = mde_of(b, alpha)
        p = float(b.p_fail)
        det.update({"se": _fin(se), "p_pass": float(b.p_pass), "exact_bound": bool(b.exact)})
        if b.error_cost is not None:  # qverify.gate.errored: what counting errored requests at their worst cost
            det["error_cost"] = {"lower": b.error_cost[0], "upper": b.error_cost[1]}
        if dc.verdict == "INCONCLUSIVE" and not ev.pass_block:
            need = needed_items(b.n, mde, dc.margin)
            if need:
                det["needed_items"] = need
                advice = (f"about {need} items (at these replicates) would make a {dc.margin:.3g} loss detectable: the "
                          f"budgeted gate (`qverify gate`, the default; `--budget REQUESTS`) adds items at sequential "
                          f"levels within one alpha; any later gate of these runs spends only the alpha this one left "
                          f"(a fixed gate leaves none: another look is optional stopping and is refused)")
    det["noise_sd"] = ev.noise_sd
    det["tolerance_configured"] = ev.tolerance
    method = "one-sided t bound on item-clustered paired differences"
    if b is not None and bool(b.exact):
        method = "exact betting bound on the mean paired difference (few items changed)"
    return MetricResult(
        metric=ev.name, direction=ev.direction, gated=ev.gated,
        baseline_mean=_fin(summary["baseline_mean"]), candidate_mean=_fin(summary["candidate_mean"]),
        baseline_spread=[_fin(x) for x in summary["baseline_spread"] or []],
        candidate_spread=[_fin(x) for x in summary["candidate_spread"] or []],
        delta=_fin(delta), ci_low=_fin(lo), ci_high=_fin(hi), noise_band=_fin(ev.noise_sd), tolerance=dc.margin,
        mde=_fin(mde), p_value=p, p_adjusted=dc.p_fail_adjusted, flips=flips, n_items=len(ev.d), method=method,
        verdict=dc.verdict, reason=dc.reason, advice=advice, details=det)


def _fin(x: float | None) -> float:
    """NaN/inf never reach gate.json (JSON has no NaN)."""
    return float(x) if x is not None and math.isfinite(x) else 0.0
