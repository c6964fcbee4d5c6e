"""From two runs of a suite to each gate metric's paired evidence (qverify.gate.rule.Evidence).

The pair rules and why they hold are in qverify.gate.design; refusals are decided here,
where it is known what the runs lack: a declared metric with no value on a side, trigger-F1
with no tool call on either side, answers cut at max_tokens above LENGTH_SHARE.
"""

from __future__ import annotations

import numpy as np

from qverify.config import MetricRule
from qverify.gate import design as dz
from qverify.gate import errored as er
from qverify.gate import pairwise as pw
from qverify.gate.loader import RunData
from qverify.gate.metrics import MetricSpec, apply_rules, expand, specs_for_suite
from qverify.gate.reference import MatchReference
from qverify.gate.rule import Evidence

# Suites scored as finished answers: an answer cut at max_tokens was never given. Above this
# share of finish=length results on either side no metric of the suite may PASS (FAIL stands).
LENGTH_SHARE = 0.10
LENGTH_CHECKED = ("coding", "toolcall", "longctx")


# The KL excess (candidate-to-baseline minus the baseline's own run-to-run KL) credits a candidate quieter than the
# baseline with up to half the baseline's own KL (a deterministic candidate at the centre of the baseline's runs is
# half as far from each run as two runs are from each other). From 25% of the tolerance on, that credit (up to an
# eighth of the tolerance) is large enough to change a verdict near the margin, so the report says so.
SELF_KL_WARN = 0.25


def common_items(base: RunData, cand: RunData) -> list[str]:
    return sorted(set(base.items) & set(cand.items))


def suite_metrics(base: RunData, cand: RunData, rules: dict[str, MetricRule],
                  match_ref: MatchReference | None = None) -> list[Evidence]:
    """Every declared metric of the suite, with qverify.toml's rules applied; undefined ones as refusals.
    greedy/match is compared with `match_ref` (qverify.gate.reference; None: the baseline)."""
    keys = set(base.scores) | set(cand.scores)
    specs = [apply_rules(s, rules) for s in expand(specs_for_suite(base.suite), keys)]
    items = common_items(base, cand)
    block = _length_block(base, cand)
    out: list[Evidence] = []
    kld_specs = [s for s in specs if s.statistic == "kld"]
    if kld_specs:
        if base.logprobs is not None and cand.logprobs is not None:
            out += _kld(kld_specs, base, cand, items)
        else:
            out += [_refused(s, "no logprobs on one side: KL is undefined") for s in kld_specs]
    for s in specs:
        if s.statistic == "mean":
            out.append(_mean(s, base, cand, items))
        elif s.statistic == "trigger_f1":
            out.append(_trigger(s, base, cand, items))
        elif s.statistic == "match":
            out.append(_match_against(s, match_ref or MatchReference(build_id=base.build_id, run=base), cand))
    # an informational metric a run does not emit is left out; a gated one stays, as a refusal (and so does a
    # metric that is not gated because it has nothing to measure: the report says why)
    out = [ev for ev in out if ev.gated or ev.refusal is None or ev.details.get("not_applicable")]
    for ev in out:
        ev.pass_block = ev.pass_block or block
    return out


def _length_block(base: RunData, cand: RunData) -> str | None:
    if base.suite not in LENGTH_CHECKED:
        return None
    for side, r in (("baseline", base), ("candidate", cand)):
        done = r.n_results - r.n_errors
        if done and r.n_length / done > LENGTH_SHARE:
            return (f"{r.n_length / done:.0%} of the {side}'s answers ended on finish=length (over {LENGTH_SHARE:.0%}): "
                    f"scores of unfinished answers prove nothing (raise max_tokens)")
    return None


def _refused(s: MetricSpec, why: str) -> Evidence:
    return Evidence(s.name, s.direction, s.tolerance, np.array([]), s.gated, refusal=why)


def _summary(b: np.ndarray, c: np.ndarray) -> dict:
    return {"baseline_mean": float(np.nanmean(dz.item_means(b))), "candidate_mean": float(np.nanmean(dz.item_means(c))),
            "baseline_spread": _rep_means(b), "candidate_spread": _rep_means(c), "replicates": [b.shape[1], c.shape[1]]}


def _rep_means(x: np.ndarray) -> list[float]:
    return [float(np.nanmean(col)) for col in x.T if not np.isnan(col).all()]


def _mean(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> Evidence:
    b, c = base.matrix(s.key, items), cand.matrix(s.key, items)
    gate_on = [r.matrix(s.zero_unless, items) for r in (base, cand)] if s.zero_unless else []
    if gate_on and any(np.nansum(g) > 0 for g in gate_on):  # not scored because the answer did not do what the score
        # is about: counts as 0 (no such answer on either side leaves the metric undefined, refused below)
        b, c = (np.where(np.isnan(x) & (g == 0), 0.0, x) for x, g in zip((b, c), gate_on))
    missing = [side for side, x in (("baseline", b), ("candidate", c)) if np.isnan(x).all()]
    if missing:
        return _refused(s, f"{s.name} has no value on the {' and '.join(missing)} side: the metric is undefined there")
    unit = dz.is_unit(b, c)
    filled = er.fill(b, c, base.error_rows(items), cand.error_rows(items), *_worst_best(s, 1.0)) if unit else None
    d, rows = dz.mean_diffs(b, c)
    b, c = b[rows], c[rows]
    binary = dz.is_binary(b, c)
    details = _summary(b, c)
    if binary:
        # "right" is 1 for a higher-is-better score, 0 for a lower-is-better rate
        fl = pw.flips(b, c) if s.direction == "higher" else pw.flips(1 - b, 1 - c)
        details["flips"] = fl
        details["mcnemar_p"] = pw.mcnemar_p(int(fl["regressed"]), int(fl["improved"]))
    return _with_errors(Evidence(s.name, s.direction, s.tolerance, d, s.gated, bounded=unit,
                                 noise_sd=dz.run_noise_sd(b), details=details), filled)


def _worst_best(s: MetricSpec, top: float) -> tuple[float, float]:
    """A per-request value's worst and best for the metric, on [0, top]."""
    return (0.0, top) if s.direction == "higher" else (top, 0.0)


def _with_errors(ev: Evidence, filled: er.Filled | None) -> Evidence:
    """ev with its errored requests in the bounds (qverify.gate.errored): d at the candidate's worst and best."""
    if filled is not None:
        ev.d_pass, ev.d_fail = dz.mean_diffs(*filled.for_pass)[0], dz.mean_diffs(*filled.for_fail)[0]
        ev.details["errored_requests"] = {"baseline": filled.baseline, "candidate": filled.candidate}
    return ev


def _trigger(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> Evidence:
    """K2VV trigger-F1 against the baseline's runs, jackknifed per item (qverify.gate.design)."""
    b, c = base.matrix(s.key, items), cand.matrix(s.key, items)
    if b.shape[1] < 2:
        return _refused(s, "trigger-F1 needs at least 2 baseline runs (its reference is the baseline's own runs)")
    if np.nansum(b) == 0 and np.nansum(c) == 0:
        return _refused(s, "no tool calls on either side: trigger-F1 is undefined, not 1.0")
    d, fb, fc = dz.trigger_f1_diffs(b, c)
    if np.isnan(d).any():
        return _refused(s, "trigger-F1 is undefined for some pair of runs or with an item left out (too few tool calls)")
    filled = er.fill_f1(b, c, base.error_rows(items), cand.error_rows(items))
    floor = pw.f1_floor(b, s.floor_margin) if s.floor_margin is not None else None
    details = {"baseline_mean": fb, "candidate_mean": fc, "baseline_spread": pw.f1_between(b),
               "candidate_spread": [pw.trigger_f1(b[:, k], c[:, j]) for k, j in dz.cross_pairs(b.shape[1], c.shape[1])],
               "replicates": [b.shape[1], c.shape[1]], "k2vv_floor": floor,
               "pairs": "baseline: pairs of its runs; candidate: (baseline k, candidate j != k): no same-seed pair"}
    ev = _with_errors(Evidence(s.name, s.direction, s.tolerance, d, s.gated, details=details), None)
    if filled is not None:  # F1 is a ratio: the filled runs give their own jackknife differences
        dp, df = dz.trigger_f1_diffs(*filled.for_pass)[0], dz.trigger_f1_diffs(*filled.for_fail)[0]
        if not (np.isnan(dp).any() or np.isnan(df).any()):
            ev.d_pass, ev.d_fail = dp, df
            ev.details["errored_requests"] = {"baseline": filled.baseline, "candidate": filled.candidate}
    return ev


def _match_against(s: MetricSpec, ref: MatchReference, cand: RunData) -> Evidence:
    if ref.not_applicable:
        return Evidence(s.name, s.direction, s.tolerance, np.array([]), gated=False, refusal=ref.not_applicable,
                        details={"not_applicable": True})
    if ref.refusal or ref.run is None:
        return _refused(s, ref.refusal or "no reference build for greedy/match")
    ev = _match(s, ref.run, cand, common_items(ref.run, cand))
    ev.details["reference"] = ref.build_id
    if s.scope:
        ev.details["tolerance_scope"] = s.scope
    return ev


def _match(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> Evidence:
    """greedy/match: identity with the reference's runs (j != k) against the reference's identity with itself
    (the reference: the baseline, or the candidate's twin, qverify.gate.reference)."""
    bo, co = base.output_rows(items), cand.output_rows(items)
    kb, kc = len(base.replicates), len(cand.replicates)
    same = lambda x, y: np.nan if x is None or y is None else float(x == y)
    n = len(items)
    cm = np.array([[same(bo[i][k], co[i][j]) for k, j in dz.cross_pairs(kb, kc)] for i in range(n)]).reshape(n, -1)
    pairs = dz.base_pairs(kb, ordered=False)
    bm = np.array([[same(bo[i][k], bo[i][l]) for k, l in pairs] for i in range(n)]).reshape(n, len(pairs))
    note = "reference: pairs of its runs; candidate: (reference k, candidate j != k)"
    if not pairs:  # one baseline run: assume the stack reproduces itself (the conservative choice)
        bm, note = np.where(np.isnan(cm[:, :1]), np.nan, 1.0), note + "; one reference run: its self-identity taken as 1"
    eb, ec = base.error_rows(items), cand.error_rows(items)
    ebp = er.pair_errors(eb, eb, pairs) if pairs else np.zeros(bm.shape, bool)
    filled = er.fill_pairs(bm, cm, ebp, er.pair_errors(eb, ec, dz.cross_pairs(kb, kc)), *_worst_best(s, 1.0))
    d, rows = dz.mean_diffs(bm, cm)
    return _with_errors(Evidence(s.name, s.direction, s.tolerance, d, s.gated, bounded=True,
                                 details={**_summary(bm[rows], cm[rows]), "pairs": note}), filled)


def _kld(specs: list[MetricSpec], base: RunData, cand: RunData, items: list[str]) -> list[Evidence]:
    kb, kc = len(base.replicates), len(cand.replicates)
    mats = pw.kld_matrices(base.logprob_rows(items), cand.logprob_rows(items), [s.key for s in specs])
    eb, ec = base.error_rows(items), cand.error_rows(items)
    keep = [j * kb + k for k, j in dz.cross_pairs(kb, kc)]  # kld_matrices' candidate columns are j-major
    out = []
    for s in specs:
        b, c = mats[s.key]
        c = c[:, keep]
        if kb < 2:  # the baseline's own distance is over pairs of its runs
            out.append(_refused(s, f"{s.name}: the baseline's own KL is measured between pairs of its runs, and its kld "
                                   f"run has {kb} replicate (fix: qverify eval {base.build_id} --suites kld "
                                   f"--replicates 2, or more)"))
            continue
        if np.isnan(b).all() or np.isnan(c).all():
            side = "baseline" if np.isnan(b).all() else "candidate"
            out.append(_refused(s, f"{s.name}: no item has logprobs in the {side}'s runs"))
            continue
        if s.broken is not None:
            out.append(_broken(s, b, c, er.pair_errors(eb, ec, dz.cross_pairs(kb, kc)), items))
            continue
        scale, exact, filled = 1.0, False, None
        if s.cap is not None:  # capped: d_i in [-cap, cap], the exact betting bound decides (heavy tails)
            b, c, scale, exact = np.minimum(b, s.cap), np.minimum(c, s.cap), s.cap, True
        elif s.above is not None:  # the share of pairs beyond `above`, per item: a rate
            b, c = np.where(np.isnan(b), np.nan, b > s.above), np.where(np.isnan(c), np.nan, c > s.above)
        if s.cap is not None or s.above is not None:  # bounded per pair: errored requests at their worst / best
            filled = er.fill_pairs(b, c, er.pair_errors(eb, eb, dz.base_pairs(kb, ordered=True)),
                                   er.pair_errors(eb, ec, dz.cross_pairs(kb, kc)), *_worst_best(s, scale))
        d, rows = dz.mean_diffs(b, c)
        bounded = s.cap is not None or (dz.is_unit(b, c) and (s.key != "kld" or s.above is not None))
        own = float(np.nanmean(b[rows])) if rows.any() else 0.0
        warn = {} if s.key != "kld" or s.above is not None or own < SELF_KL_WARN * s.tolerance else {
            "warning": f"the baseline's own run-to-run {s.key} is {own:.3g}, {own / s.tolerance:.0%} of the tolerance: "
                       f"the excess credits a candidate quieter than the baseline with up to half of it"}
        out.append(_with_errors(Evidence(
            s.name, s.direction, s.tolerance, d, s.gated, bounded=bounded, scale=scale, always_exact=exact,
            details={**_summary(b[rows], c[rows]), "baseline_self": own, **warn,
                     "pairs": "baseline: ordered pairs of its runs; candidate: (baseline k, candidate j != k)"}), filled))
    return out


def _broken(s: MetricSpec, b: np.ndarray, c: np.ndarray, ec: np.ndarray, items: list[str]) -> Evidence:
    """kld/broken: item i is broken when its KL to the baseline (mean over the candidate's pairs, uncapped) exceeds
    s.broken and every one of the baseline's own pairs on the item; the share of broken items is bounded exactly
    (qverify.gate.bounds.share_bounds). An item with an errored candidate request counts as broken for PASS and as
    what its answered pairs show for FAIL (qverify.gate.errored)."""
    with np.errstate(all="ignore"):
        kl = dz.item_means(c)
        own = np.where(np.isnan(b).all(axis=1), 0.0, np.nan_to_num(np.nanmax(np.where(np.isnan(b), -np.inf, b), axis=1)))
    hit = ~np.isnan(kl) & (kl > np.maximum(s.broken, own))
    err = (ec & np.isnan(c)).any(axis=1)
    seen, scored = ~np.isnan(kl), ~np.isnan(kl) | err
    ev = Evidence(s.name, s.direction, s.tolerance, hit[seen].astype(float), s.gated, bounded=True, share=True,
                  details={"baseline_mean": float(np.mean(own[seen] > s.broken)) if seen.any() else 0.0,
                           "candidate_mean": float(hit[seen].mean()) if seen.any() else 0.0,
                           "baseline_spread": [], "candidate_spread": [], "replicates": [b.shape[1], c.shape[1]],
                           "broken_items": [items[i] for i in np.flatnonzero(hit)][:20],
                           "pairs": f"item broken: its mean KL over (baseline k, candidate j != k) above {s.broken} "
                                    f"and above every pair of the baseline's own runs"})
    if err[scored].any():
        ev.d_pass, ev.d_fail = (hit | err)[scored].astype(float), hit[scored].astype(float)
        ev.details["errored_requests"] = {"baseline": 0, "candidate": int((ec & np.isnan(c)).sum())}
    return ev
