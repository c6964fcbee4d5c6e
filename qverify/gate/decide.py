"""The verdict rule (issue 8), per metric and per build.

With "better" oriented up (a lower-is-better metric is negated), band = the noise band,
tol = the tolerance, CI = the paired-bootstrap interval of delta:
  FAIL          the whole CI lies below -(band + tol), after Holm over the gated metrics
                or, for trigger-F1, its F1 is under the K2VV floor with the CI wholly below
                -band (under the floor alone it is INCONCLUSIVE, never PASS);
  INCONCLUSIVE  MDE = 2.8 SE > tol (it could not have seen a tolerance-sized loss), or
                fewer than 2 baseline replicates / MIN_ITEMS items, or nothing else applies;
  PASS          delta >= -band (within run-to-run noise or better) and delta >= -tol.
A baseline whose replicates are identical has no noise to measure (band = 0); then the
rule falls back to paired item-level tests with the tolerance: PASS when the CI's low end
is >= -tol, FAIL when the whole CI is below -tol, McNemar on the flips reported beside.
A build FAILs if any gated metric fails, is INCONCLUSIVE if any is inconclusive, else PASSes.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from qverify.gate import pairwise as pw
from qverify.gate import stats as st
from qverify.models import MetricResult, Verdict
from qverify.suites.metric_spec import MetricSpec

MIN_ITEMS = 10  # below this a bootstrap over items says little; no verdict but INCONCLUSIVE
DISTANCES = ("kld", "match")  # statistics that compare each run with the baseline's runs: equivalence-tested


@dataclass
class MetricData:
    """One metric's paired matrices (rows = items scored on both sides) and what the rule needs beside."""

    spec: MetricSpec
    base: np.ndarray
    cand: np.ndarray
    kb: int  # baseline runs (replicates): the band's 1/kb
    kc: int  # candidate runs
    within: bool = True  # resample replicates within items (off for matrices whose columns are run pairs)
    floor: float | None = None  # trigger-F1: K2VV floor and the candidate's F1 checked against it
    floor_value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class Measured:
    data: MetricData
    noise: st.Noise
    band: float
    boot: st.Boot
    mde: float
    p_fail: float | None
    needed: st.Needed
    flips: dict[str, float]
    mcnemar: float | None

    @property
    def sign(self) -> int:
        return 1 if self.data.spec.direction == "higher" else -1


def measure(d: MetricData, alpha: float, m: int, n_boot: int, seed: int) -> Measured:
    """Everything the verdict needs, for one metric; m = number of gated metrics (band's Bonferroni)."""
    noise = st.noise_model(d.base, check_run_level=d.within)
    kb, kc = d.kb, d.kc
    if d.within and len(d.base):  # replicates per item can be fewer than runs (errors, keys not emitted)
        kb, kc = st.harmonic_count(d.base), st.harmonic_count(d.cand)
    band = st.noise_band(noise, kb, kc, alpha, m)
    boot = st.paired_bootstrap(d.base, d.cand, n_boot, seed ^ zlib.crc32(d.spec.name.encode()), alpha, d.within)
    mde = st.mde(boot.se, alpha) if len(d.base) > 1 else math.nan
    sign = 1 if d.spec.direction == "higher" else -1
    p_fail = None
    if d.kb >= 2 and math.isfinite(band) and len(boot.draws) and len(d.base) >= MIN_ITEMS:
        p_fail = st.p_not_below(sign * boot.draws, -(band + d.spec.tolerance))
    needed = st.needed_for(d.base, d.cand, boot.se, d.spec.tolerance, alpha)
    flips, mcn = {}, None
    if d.spec.statistic == "mean" and len(d.base) and pw.is_binary(d.base, d.cand):
        # "right" is 1 for a higher-is-better score, 0 for a lower-is-better rate
        flips = pw.flips(d.base, d.cand) if sign > 0 else pw.flips(1 - d.base, 1 - d.cand)
        mcn = pw.mcnemar_p(int(flips["regressed"]), int(flips["improved"]))
    return Measured(d, noise, band, boot, mde, p_fail, needed, flips, mcn)


def decide(ms: list[Measured], alpha: float) -> list[MetricResult]:
    """Holm over the gated metrics' FAIL p-values, then each metric's verdict."""
    gated = [i for i, m in enumerate(ms) if m.data.spec.gated]
    adj = st.holm([ms[i].p_fail for i in gated])
    p_adj: dict[int, float | None] = dict(zip(gated, adj))
    return [_result(m, p_adj.get(i), alpha, len(gated)) for i, m in enumerate(ms)]


def _result(m: Measured, p_adj: float | None, alpha: float, n_gated: int) -> MetricResult:
    d, s = m.data, m.data.spec
    verdict, reason, advice = _verdict(m, p_adj, alpha)
    fallback = m.noise.deterministic
    details: dict[str, Any] = {
        "noise": m.noise.as_dict(), "se": _fin(m.boot.se),
        "band_level": 1 - alpha / max(n_gated, 1) if s.gated else 1 - alpha,
        "p_zero": st.p_two_sided_zero(m.boot.draws) if len(m.boot.draws) else None,
        "replicates": {"baseline": d.kb, "candidate": d.kc}, "fallback": fallback,
        "needed": {"items": m.needed.items, "replicates": m.needed.replicates}, **d.details}
    if m.mcnemar is not None:
        details["mcnemar_p"] = m.mcnemar
    if d.floor is not None:
        details["f1_floor"] = d.floor
        details["candidate_f1"] = d.floor_value
    unavailable = [k for k, v in (("noise_band", m.band), ("mde", m.mde), ("ci", m.boot.ci_low)) if not math.isfinite(v)]
    if unavailable:
        details["unavailable"] = unavailable
    method = "paired-bootstrap (items, then replicates)" if d.within else "paired-bootstrap (items)"
    if fallback:
        method = "deterministic baseline: paired-bootstrap" + (" + McNemar" if m.mcnemar is not None else "")
    return MetricResult(
        metric=s.name, direction=s.direction, gated=s.gated,
        baseline_mean=_fin(float(np.mean(st.item_means(d.base)))) if len(d.base) else 0.0,
        candidate_mean=_fin(float(np.mean(st.item_means(d.cand)))) if len(d.cand) else 0.0,
        baseline_spread=st.replicate_means(d.base), candidate_spread=st.replicate_means(d.cand),
        delta=_fin(m.boot.delta), ci_low=_fin(m.boot.ci_low), ci_high=_fin(m.boot.ci_high),
        noise_band=_fin(m.band), tolerance=s.tolerance, mde=_fin(m.mde),
        p_value=m.p_fail, p_adjusted=p_adj, flips=m.flips, n_items=len(d.base), method=method,
        verdict=verdict, reason=reason, advice=advice, details=details)


def _verdict(m: Measured, p_adj: float | None, alpha: float) -> tuple[Verdict, str, str | None]:
    d, s = m.data, m.data.spec
    n, tol, band, sign = len(d.base), s.tolerance, m.band, m.sign
    if d.kb < 2:
        return ("INCONCLUSIVE", f"the baseline has {d.kb} replicate(s); the noise model needs at least 2",
                "rerun the baseline with --replicates 3 (or more)")
    if n == 0:
        return "INCONCLUSIVE", "no item was scored on both sides", None
    if not math.isfinite(band):
        why = "no item has two baseline replicates with a value, so there is no noise model"
        return "INCONCLUSIVE", why, "rerun the baseline with --replicates 3 (or more)"
    if d.floor is not None and d.floor_value is not None and d.floor_value < d.floor:
        # K2VV applies its bar to one run; here it also needs the CI wholly below the noise band, or
        # an A/A candidate would inherit the bar's own false-FAIL rate (several % at 60 items, T=1)
        below = (f"candidate trigger-F1 {d.floor_value:.3f} is below the K2VV floor {d.floor:.3f} "
                 f"(lowest F1 between baseline runs minus {s.floor_margin})")
        if max(sign * m.boot.ci_low, sign * m.boot.ci_high) < -band:
            return "FAIL", f"{below} and its Δ CI lies wholly below the noise band ±{band:.3f}", None
        if n >= MIN_ITEMS:
            return "INCONCLUSIVE", f"{below}, but its Δ CI reaches into the noise band ±{band:.3f}", _advice(m)
    if n < MIN_ITEMS:
        return ("INCONCLUSIVE", f"only {n} paired items; a verdict needs at least {MIN_ITEMS}",
                f"run at least {max(MIN_ITEMS, m.needed.items or 0)} items")
    delta, lo, hi = m.boot.delta, m.boot.ci_low, m.boot.ci_high
    allow = band + tol
    worse = "below" if sign > 0 else "above"
    thr = f"{-sign * allow:+.3f}"
    p = p_adj if p_adj is not None else m.p_fail
    ci = f"95% CI [{lo:+.3f}, {hi:+.3f}]"
    if p is not None and p < alpha / 2:
        holm = f"Holm p={p:.2g}" if p_adj is not None else f"p={p:.2g}"
        what = "tolerance" if m.noise.deterministic else "noise band + tolerance"
        return "FAIL", f"Δ {delta:+.3f}, {ci}, lies wholly {worse} {thr} ({what}; {holm})", None
    if m.mde > tol:
        why = f"MDE {m.mde:.3f} exceeds the tolerance {tol:.3f}: a tolerance-sized loss would go unseen"
        return "INCONCLUSIVE", why, _advice(m)
    od, olo = sign * delta, min(sign * lo, sign * hi)
    if s.statistic in DISTANCES and not m.noise.deterministic:
        # A distance to the baseline (KL, output identity) moves under *any* lossy change, so "within the
        # noise band" alone would never pass one; the band is the floor it is measured from, and the
        # tolerance is the excess the user accepts: an equivalence test, the whole CI within band + tolerance.
        if olo >= -allow:
            return ("PASS", f"Δ {delta:+.3f} over the baseline's own run-to-run value, {ci}, lies within the noise "
                            f"band ±{band:.3f} + tolerance {tol:.3f}", None)
        return "INCONCLUSIVE", f"Δ {delta:+.3f}, {ci}, reaches past noise band + tolerance {thr}", _advice(m)
    if m.noise.deterministic:
        mc = ""
        if m.mcnemar is not None:
            mc = f"; McNemar p={m.mcnemar:.2g} on {m.flips['regressed']:.0f}/{m.flips['improved']:.0f} flips"
        what = f"baseline replicates identical, so item-level paired test: Δ {delta:+.3f}, {ci}"
        if olo >= -tol:
            return "PASS", f"{what} within tolerance {tol:.3f}{mc}", None
        return "INCONCLUSIVE", f"{what} reaches past the tolerance {tol:.3f}{mc}", _advice(m)
    if od >= -band and od >= -tol:
        why = f"Δ {delta:+.3f} is within the noise band ±{band:.3f} (or better) and the tolerance {tol:.3f}"
        return "PASS", why, None
    why = f"outside the noise band ±{band:.3f}" if od < -band else f"worse than the tolerance {tol:.3f}"
    return "INCONCLUSIVE", f"Δ {delta:+.3f} is {why}, but its {ci} is not wholly {worse} {thr}", _advice(m)


def _advice(m: Measured) -> str | None:
    nd, d = m.needed, m.data
    parts = []
    if nd.replicates is not None and nd.replicates > min(d.kb, d.kc):
        parts.append(f"{nd.replicates} replicates per build (now {d.kb}/{d.kc})")
    if nd.items is not None and nd.items > len(d.base):
        parts.append(f"{nd.items} items (now {len(d.base)})")
    if not parts:
        return None
    return f"for MDE <= {m.data.spec.tolerance:.3f}: run " + " or ".join(parts)


def _fin(x: float) -> float:
    """NaN/inf never reach gate.json (JSON has no NaN); `details.unavailable` names what was not computable."""
    return float(x) if x is not None and math.isfinite(x) else 0.0


ORDER = {"FAIL": 2, "INCONCLUSIVE": 1, "PASS": 0}


def build_verdict(metrics: list[MetricResult], integrity: list[str]) -> tuple[Verdict, list[str]]:
    """FAIL if any gated metric fails; INCONCLUSIVE if any is inconclusive or the runs were refused; else PASS."""
    gated = [m for m in metrics if m.gated]
    fails = [f"{m.metric}: {m.reason}" for m in gated if m.verdict == "FAIL"]
    if fails:
        return "FAIL", fails + [f"refused: {r}" for r in integrity]
    if integrity:
        return "INCONCLUSIVE", [f"refused: {r}" for r in integrity]
    if not gated:
        return "INCONCLUSIVE", ["no gated metric could be evaluated"]
    inc = [f"{m.metric}: {m.reason}" for m in gated if m.verdict == "INCONCLUSIVE"]
    if inc:
        return "INCONCLUSIVE", inc
    return "PASS", [f"all {len(gated)} gated metrics within noise and tolerance"]
