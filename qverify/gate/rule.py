"""The verdict rule: three-way, with stated error rates, per metric and per build.

Orient every metric so that higher is better (a lower-is-better metric's d is negated) and
let L, U be the one-sided (1 - alpha) bounds of Delta (qverify.gate.bounds; at a look of the
sequential gate, alpha is that look's group-sequential level, qverify.gate.boundaries). With margin tol > 0:

  PASS          L > -tol                     non-inferiority shown at level alpha
  FAIL          Holm-adjusted p_fail <= alpha, p_fail testing H0: Delta >= -tol
                (i.e. U < -tol, family-wise over the gated metrics)
  INCONCLUSIVE  otherwise, or a refusal (too few items, an undefined metric, no tool
                calls on either side, too many answers cut at max_tokens: see Evidence)

A build PASSes only if every gated metric PASSes: an intersection-union test, whose
level is alpha with no multiplicity correction (Berger 1982). It FAILs if any gated metric
FAILs (Holm keeps the chance of any false FAIL <= alpha). The baseline's run-to-run noise
is reported, never added to an acceptance region; `noise_k` (qverify.toml) may set the
margin to max(tolerance, noise_k * run-to-run SD), a documented option.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from qverify.config import ALPHA  # the one default (config.py)
from qverify.gate.bounds import Bounds, paired_bounds, share_bounds
from qverify.gate.unseen_tail import capped_bounds
from qverify.models import MetricResult

Verdict = Literal["PASS", "FAIL", "INCONCLUSIVE"]
MIN_ITEMS = 10  # below this the t bound's sd is itself too uncertain to state a level
ORDER: dict[str, int] = {"PASS": 0, "INCONCLUSIVE": 1, "FAIL": 2}


@dataclass
class Evidence:
    """One metric's paired evidence: per-item differences d_i = candidate - baseline (not oriented)."""

    name: str
    direction: Literal["higher", "lower"]
    tolerance: float
    d: np.ndarray
    gated: bool = True
    bounded: bool = False  # both sides' per-item values in [0, scale]: the exact (betting) bound applies
    scale: float = 1.0  # bounded: d_i in [-scale, scale] (a capped distance's cap)
    always_exact: bool = False  # a capped distance: qverify.gate.unseen_tail.capped_bounds decides, whatever the data
    share: bool = False  # d_i is 1 where the candidate hit a rare event (kld/broken): Clopper-Pearson decides
    refusal: str | None = None  # INCONCLUSIVE whatever the data say (undefined metric, no tool calls, ...)
    pass_block: str | None = None  # blocks PASS only; a FAIL still stands (e.g. answers cut at max_tokens)
    noise_sd: float | None = None  # baseline run-to-run SD of one run's mean (report; noise_k margin)
    details: dict[str, Any] = field(default_factory=dict)
    # errored requests filled in (qverify.gate.errored): d with them at the candidate's worst (PASS, the lower
    # bound) and at its best (FAIL, the upper bound); None: no errored request on a scored item
    d_pass: np.ndarray | None = None
    d_fail: np.ndarray | None = None

    @property
    def sign(self) -> int:
        return 1 if self.direction == "higher" else -1


@dataclass
class Decision:
    evidence: Evidence
    verdict: Verdict
    reason: str
    margin: float  # the tolerance actually used
    bounds: Bounds | None = None
    p_fail_adjusted: float | None = None


def margin(ev: Evidence, noise_k: float | None) -> float:
    if noise_k is None or ev.noise_sd is None or not math.isfinite(ev.noise_sd):
        return ev.tolerance
    return max(ev.tolerance, noise_k * ev.noise_sd)


def measure(ev: Evidence, alpha: float, noise_k: float | None = None) -> Bounds | None:
    """The metric's bounds; with errored requests, PASS from d_pass and FAIL from d_fail (qverify.gate.errored),
    Δ from the answered requests, and what the errors cost each bound."""
    if ev.refusal is not None or len(ev.d if ev.d_pass is None else ev.d_pass) < MIN_ITEMS:
        return None
    tol = margin(ev, noise_k)

    def bounds(d: np.ndarray) -> Bounds:
        if ev.share:
            return share_bounds(ev.sign * d, tol, alpha)
        if ev.always_exact:  # a capped distance (kld/kld): betting, and for PASS the t bound with an unseen tail
            return capped_bounds(ev.sign * d, tol, alpha, ev.scale)
        return paired_bounds(ev.sign * d, tol, alpha, ev.bounded, scale=ev.scale)

    if ev.d_pass is None or ev.d_fail is None:
        return bounds(ev.d)
    worst, best = bounds(ev.d_pass), bounds(ev.d_fail)
    seen = bounds(ev.d) if len(ev.d) >= MIN_ITEMS else None
    cost = None if seen is None else (max(float(seen.lower) - float(worst.lower), 0.0),
                                      max(float(best.upper) - float(seen.upper), 0.0))
    return replace(worst, delta=seen.delta if seen is not None else worst.delta, upper=best.upper,
                   p_fail=best.p_fail, exact=np.asarray(bool(worst.exact) or bool(best.exact)), error_cost=cost)


def holm(p: list[float]) -> list[float]:
    """Holm step-down adjusted p-values: adj_(j) = max_{i<=j} min(1, (m - i) p_(i))."""
    out, running = [1.0] * len(p), 0.0
    for rank, i in enumerate(sorted(range(len(p)), key=p.__getitem__)):
        running = max(running, min(1.0, (len(p) - rank) * p[i]))
        out[i] = running
    return out


def step_down(p: list[float], level_for: Callable[[int], float], family: int) -> list[bool]:
    """Holm's step-down with a level per family size: the r-th smallest p (r from 0) is rejected when it and
    every smaller one is <= level_for(family - r). level_for(k) = alpha / k is Holm (p_adj <= alpha)."""
    out = [False] * len(p)
    for rank, i in enumerate(sorted(range(len(p)), key=p.__getitem__)):
        if p[i] > level_for(family - rank):
            break
        out[i] = True
    return out


def decide(evs: list[Evidence], alpha: float = ALPHA, noise_k: float | None = None,
           bounds: list[Bounds | None] | None = None, fail_level: Callable[[int], float] | None = None,
           family: int | None = None) -> list[Decision]:
    """Each metric's verdict; Holm over the gated metrics' FAIL p-values (bounds may be given).

    At a look of the sequential gate, PASS bounds use alpha = that look's nominal level, and FAIL uses
    fail_level(k), the look's level for one test in a family of k, over `family` hypotheses (at least
    the gated metrics here): qverify.gate.boundaries.LookLevels."""
    bs = bounds if bounds is not None else [measure(e, alpha, noise_k) for e in evs]
    gated = [i for i, (e, b) in enumerate(zip(evs, bs)) if e.gated and b is not None]
    p = [float(bs[i].p_fail) for i in gated]
    adj = dict(zip(gated, holm(p)))
    level_for = fail_level or (lambda k: alpha / k)
    fails = dict(zip(gated, step_down(p, level_for, max(family or 0, len(gated)))))
    return [_one(e, b, alpha, margin(e, noise_k), adj.get(i),  # an informational metric is its own family
                 fails.get(i, b is not None and float(b.p_fail) <= level_for(1))) for i, (e, b) in enumerate(zip(evs, bs))]


def _one(ev: Evidence, b: Bounds | None, alpha: float, tol: float, p_adj: float | None, fails: bool) -> Decision:
    dc = _verdict(ev, b, alpha, tol, p_adj, fails)
    if ev.details.get("warning"):  # a caveat the verdict stands with (e.g. a large baseline self-KL)
        dc.reason += f" (warning: {ev.details['warning']})"
    return dc


def _verdict(ev: Evidence, b: Bounds | None, alpha: float, tol: float, p_adj: float | None, fails: bool) -> Decision:
    if ev.refusal is not None:
        return Decision(ev, "INCONCLUSIVE", ev.refusal, tol)
    if b is None:
        return Decision(ev, "INCONCLUSIVE", f"only {len(ev.d)} paired items; a verdict needs at least {MIN_ITEMS}", tol)
    lo, hi, delta = float(b.lower), float(b.upper), float(b.delta)
    show = f"Δ {ev.sign * delta:+.4f}, one-sided {100 * (1 - alpha):.4g}% bounds [{_o(ev, lo, hi)}]"
    how = " (exact betting bound: few items changed)" if bool(b.exact) else ""
    if b.error_cost is not None:  # qverify.gate.errored: errored requests at the candidate's worst / best
        how += (f" (errored requests counted at their worst for PASS and best for FAIL: they moved the bounds by "
                f"{b.error_cost[0]:.4f} / {b.error_cost[1]:.4f})")
    worse = "below" if ev.sign > 0 else "above"
    p = p_adj if p_adj is not None else float(b.p_fail)
    if fails:
        return Decision(ev, "FAIL", f"{show}{how}: worse than the tolerance {tol:.4g} (p={p:.2g}"
                                    f"{', Holm' if p_adj is not None else ''})", tol, b, p_adj)
    if lo > -tol:
        if ev.pass_block:
            return Decision(ev, "INCONCLUSIVE", f"{show} within the tolerance {tol:.4g}, but {ev.pass_block}", tol, b, p_adj)
        return Decision(ev, "PASS", f"{show}{how}: no worse than the tolerance {tol:.4g}", tol, b, p_adj)
    return Decision(ev, "INCONCLUSIVE", f"{show}{how}: reaches {worse} the tolerance {-ev.sign * tol:+.4g} and is "
                                        f"not wholly past it", tol, b, p_adj)


def _o(ev: Evidence, lo: float, hi: float) -> str:
    """Bounds in the metric's own direction (a lower-is-better metric's interval flips back)."""
    a, b = (lo, hi) if ev.sign > 0 else (-hi, -lo)
    return f"{a:+.4f}, {b:+.4f}"


def build_verdict(metrics: list[MetricResult], refused: dict[str, list[str]]) -> tuple[Verdict, list[str]]:
    """The one rule for a build's verdict, at a look and over a whole sequence: FAIL if any gated metric FAILs;
    PASS only if every gated metric PASSes (intersection-union) and no suite was refused (`refused`: suite ->
    why its runs were not gated); otherwise INCONCLUSIVE. Reasons name the metrics that decided it and say
    how many of the declared gated metrics were decided (a refused suite with no metric measured counts one)."""
    gated = [m for m in metrics if m.gated]
    if any(m.verdict == "FAIL" for m in gated):
        return "FAIL", [f"{m.metric}: {m.reason}" for m in gated if m.verdict == "FAIL"]
    unmeasured = [s for s in refused if not any(m.metric.startswith(f"{s}/") for m in gated)]
    declared = len(gated) + len(unmeasured)
    if gated and all(m.verdict == "PASS" for m in gated) and not refused:
        return "PASS", [f"all {len(gated)} of {declared} declared gated metrics decided, within their tolerances"]
    decided = sum(m.verdict != "INCONCLUSIVE" and m.metric.split("/", 1)[0] not in refused for m in gated)
    reasons = [f"{m.metric}: {m.reason}" for m in gated if m.verdict == "INCONCLUSIVE"]
    reasons += [f"{s}: refused ({'; '.join(ps)})" for s, ps in sorted(refused.items())]
    return "INCONCLUSIVE", reasons + [f"{decided} of {declared} declared gated metrics decided"]


def refusals(refused: dict[str, list[str]]) -> list[str]:
    """Every suite's reasons for refusal, each once (CandidateReport.integrity), in the order first met."""
    return list(dict.fromkeys(p for ps in refused.values() for p in ps))
