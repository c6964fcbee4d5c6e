"""The decision rule as pure functions: each test fails if the rule it names is wrong."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as sps

from qverify.gate import betting
from qverify.gate import design as dz
from qverify.gate.bounds import CLT_MIN_DISCORDANT, paired_bounds, t_bounds, tilted_skewness
from qverify.gate.rule import Evidence, build_verdict, decide, holm, step_down

TOL = 0.03


def test_zero_variance_is_not_proof_of_no_change():
    """Every item identical on both sides: the exact bound is about -3.4/n (Clopper-Pearson's was -3.7/n), not [0, 0]."""
    b = paired_bounds(np.zeros(60), TOL, 0.05, bounded=True)
    assert b.se == 0 and b.exact
    assert -4 / 60 < b.lower < -TOL  # 60 items cannot show < 3 points
    ev = Evidence("coding/pass@1", "higher", TOL, np.zeros(60), bounded=True)
    assert decide([ev])[0].verdict == "INCONCLUSIVE"
    ev = Evidence("coding/pass@1", "higher", TOL, np.zeros(400), bounded=True)
    assert decide([ev])[0].verdict == "PASS"  # 400 unchanged items do bound the loss under 1 point
    # an unbounded metric (KL) has no exact bound; a zero-variance shift is taken at face value
    assert not paired_bounds(np.zeros(60), TOL, 0.05, bounded=False).exact


def test_few_discordant_items_use_the_exact_betting_bound():
    d = np.zeros(300)
    d[:5] = -1.0  # 5 items lost everywhere, nothing gained
    b = paired_bounds(d, TOL, 0.05, bounded=True)
    lo, hi, pp, pf = betting.bounds_and_p(d, TOL, 0.05)
    assert b.exact and np.allclose([b.lower, b.upper, b.p_pass, b.p_fail], [lo, hi, pp, pf])
    d[:CLT_MIN_DISCORDANT] = -1.0
    assert not paired_bounds(d, TOL, 0.05, bounded=True).exact


def test_gains_and_losses_cancel_in_the_exact_bound():
    """4 items lost a third, 4 gained a third, in 40: the betting bound on the mean stays above -0.10, where the
    rule before (Clopper-Pearson on gains and on losses, each at alpha/2) reached -0.15: it paid twice for noise."""
    d = np.zeros(40)
    d[0:8:2], d[1:8:2] = -1 / 3, 1 / 3
    b = paired_bounds(d, 0.10, 0.05, bounded=True)
    assert b.exact and b.lower > -0.10 and b.p_pass < 0.05
    cp = -sps.beta.ppf(0.975, 4 / 3 + 1, 40 - 4 / 3)  # the old lower bound, gains' CP lower bound being 0 here
    assert cp < -0.13


@pytest.mark.parametrize("law", ["two-point", "three-point", "lattice"])
def test_the_betting_p_value_holds_its_level_at_the_margin(law):
    """Under laws with mean exactly -tol (the least favourable: all mass on the extremes, or a skewed lattice),
    P(p_pass <= alpha) <= alpha, 20,000 trials at 40 items (limit alpha + 3 SE), and the bound agrees with the
    p-value (L > -tol iff p < alpha). Breaking the bet (no cap: lam up to 2/(1+m)) makes the two-point law fail."""
    rng, tol, n, trials = np.random.default_rng(5), 0.10, 40, 20_000
    if law == "two-point":  # -1 or +1 with mean -tol
        d = np.where(rng.random((trials, n)) < (1 - tol) / 2, 1.0, -1.0)
    elif law == "three-point":
        d = rng.choice([-1.0, 0.0, 0.5], p=[0.2, 0.6, 0.2], size=(trials, n))  # mean -0.1
    else:
        d = rng.choice([-1.0, -1 / 3, 0.0, 1 / 3], p=[0.05, 0.15, 0.55, 0.25], size=(trials, n))  # mean -0.05-0.05+1/12
        tol = -float(np.dot([-1.0, -1 / 3, 0.0, 1 / 3], [0.05, 0.15, 0.55, 0.25]))
    lo, hi, pp, pf = betting.bounds_and_p(d, tol, 0.05)
    assert np.mean(pp <= 0.05) <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / trials)
    assert np.mean(pf <= 0.05) <= 0.05 + 3 * np.sqrt(0.05 * 0.95 / trials)
    assert np.array_equal(lo > -tol, pp < 0.05)


def test_the_t_bound_corrects_for_skewed_differences():
    """Losses outnumbering gains skew d to the left; the corrected lower bound sits below the plain t's
    (the plain one passed 6% at the tolerance, benchmarks/gate_oc.py), and symmetric d is left alone."""
    d = np.zeros(1500)
    d[:52], d[52:60] = -1.0, 1.0
    plain = d.mean() - sps.t.ppf(0.95, 1499) * d.std(ddof=1) / np.sqrt(1500)
    assert t_bounds(d, 0.05)[2] < plain - 0.0003
    sym = np.zeros(1500)
    sym[:40], sym[40:80] = -1.0, 1.0
    assert t_bounds(sym, 0.05)[2] == pytest.approx(-t_bounds(sym, 0.05)[3], rel=1e-9)


def test_tilted_skewness_is_the_skewness_of_the_null_distribution_on_the_sample():
    """Tilting a {-1, 0} sample to mean -p gives Bernoulli(p)'s skewness, whatever the sample's own share; tilting
    to the sample's own mean gives its own skewness; a mean outside the sample's range has no tilt (NaN)."""
    d = np.zeros(400)
    d[:40] = -1.0  # own share 0.1
    for p in (0.03, 0.1, 0.3):
        assert tilted_skewness(d, -p) == pytest.approx(-(1 - 2 * p) / np.sqrt(p * (1 - p)), rel=1e-6)
    x = np.random.default_rng(0).choice([-1.0, -1 / 3, 0.0, 1 / 3], p=[0.05, 0.05, 0.85, 0.05], size=300)
    assert tilted_skewness(x, x.mean()) == pytest.approx(sps.skew(x), rel=1e-9)
    assert np.isnan(tilted_skewness(np.abs(x), -0.03))


def test_the_corrected_bound_answers_the_test_at_the_margin():
    """L > -tol exactly when p_pass < alpha, U < -tol exactly when p_fail < alpha (one skewness for both)."""
    rng = np.random.default_rng(3)
    d = rng.choice([-1.0, -1 / 3, 0.0, 1 / 3, 1.0], p=[0.06, 0.06, 0.8, 0.05, 0.03], size=(4000, 250))
    b = paired_bounds(d, TOL, 0.05, bounded=True)
    assert not b.exact.any()  # the t bound alone: 250 items with ~50 changed
    assert np.array_equal(b.lower > -TOL, b.p_pass < 0.05) and np.array_equal(b.upper < -TOL, b.p_fail < 0.05)
    assert (b.lower > -TOL).any() and (b.upper < -TOL).any()
    assert not np.array_equal(b.lower, paired_bounds(d, TOL, 0.05, bounded=True, skew_at_margin=False).lower)


def test_item_clustered_se_uses_the_shared_seed_pairing():
    """Replicate k shares a seed on both builds: Var(delta) comes from the paired item differences, which
    is far below Var(b) + Var(c) when the builds are coupled; an unpaired SE would never PASS here."""
    rng = np.random.default_rng(0)
    n, k = 400, 3
    p = np.where(rng.random(n) < 0.5, 0.5, 1.0)  # half the items flip run to run
    u = rng.random((n, k))
    b, c = (u < p[:, None]).astype(float), (u < p[:, None]).astype(float)
    flip = (rng.random((n, k)) < 0.15) & (p[:, None] == 0.5)  # the candidate redraws some unstable answers
    c[flip] = 1 - c[flip]
    d, rows = dz.mean_diffs(b, c)
    bd = paired_bounds(d, TOL, 0.05, bounded=True)
    unpaired = np.sqrt(dz.item_means(b).var(ddof=1) / n + dz.item_means(c).var(ddof=1) / n)
    assert bd.se == pytest.approx(d.std(ddof=1) / np.sqrt(n)) and bd.se < unpaired / 2
    assert 0 - sps.norm.ppf(0.95) * unpaired < -TOL  # an unpaired SE could not PASS these data
    assert decide([Evidence("m", "higher", TOL, d, bounded=True)])[0].verdict == "PASS"


def test_trigger_f1_aa_is_unbiased_because_no_same_seed_pair_is_used():
    """A/A with strongly coupled seeds: Delta F1 averages ~0. Including the same-seed (k, k) pairs on the
    candidate side only would bias it upwards (the old design's +0.06)."""
    rng = np.random.default_rng(1)
    n, k, trials = 120, 3, 300
    deltas, biased = [], []
    for _ in range(trials):
        t = np.where(rng.random(n) < 0.5, 0.6, np.where(rng.random(n) < 0.5, 1.0, 0.0))
        u = rng.random((n, k))
        b = (u < t[:, None]).astype(float)
        c = (np.where(rng.random((n, k)) < 0.9, u, rng.random((n, k))) < t[:, None]).astype(float)
        d, fb, fc = dz.trigger_f1_diffs(b, c)
        deltas.append(fc - fb)
        biased.append(np.mean([dz.f1_with_jackknife(b[:, kk], c[:, j])[0] for kk in range(k) for j in range(k)]) - fb)
        assert d.mean() == pytest.approx(fc - fb)  # the pseudo-values' mean is the estimate
    se = np.std(deltas, ddof=1) / np.sqrt(trials)
    assert abs(np.mean(deltas)) < 3 * se
    assert np.mean(biased) > 10 * se  # the design the rule avoids


def _rows(ds):
    from qverify.gate.decide import result

    return [result(d, 0.05) for d in ds]


def _build(ds):
    return build_verdict(_rows(ds), {})


def test_pass_is_intersection_union_and_fail_is_holm():
    rng = np.random.default_rng(2)
    ok = [Evidence(f"m{i}", "higher", TOL, rng.normal(0, 0.05, 2000)) for i in range(5)]
    ds = decide(ok)
    assert all(d.verdict == "PASS" for d in ds) and _build(ds)[0] == "PASS"
    # one metric inconclusive makes the build INCONCLUSIVE, however many others pass
    ds = decide(ok + [Evidence("wide", "higher", TOL, rng.normal(0, 1.0, 50))])
    assert _build(ds)[0] == "INCONCLUSIVE"
    # a lower-is-better metric is oriented: a rise beyond tolerance FAILs
    ds = decide(ok + [Evidence("rate", "lower", TOL, rng.normal(0.2, 0.05, 500))])
    assert ds[-1].verdict == "FAIL" and _build(ds)[0] == "FAIL"
    assert holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])
    # a refusal elsewhere blocks PASS
    assert build_verdict(_rows(decide(ok)), {"x": ["suite x: no results"]})[0] == "INCONCLUSIVE"


def test_step_down_is_holm_and_keeps_the_whole_family():
    """With level alpha/k, step_down rejects exactly where Holm's adjusted p <= alpha; a larger family (metrics
    decided at earlier looks of the sequential gate still count) makes every threshold stricter."""
    rng = np.random.default_rng(9)
    for _ in range(200):
        p = list(rng.uniform(0, 0.06, rng.integers(1, 8)))
        assert step_down(p, lambda k: 0.05 / k, len(p)) == [a <= 0.05 for a in holm(p)]
    assert step_down([0.02], lambda k: 0.05 / k, 1) == [True]
    assert step_down([0.02], lambda k: 0.05 / k, 3) == [False]  # two PASSed metrics still in the family
    # decide passes the family on: the same evidence FAILs alone and not in a family of 3
    d = rng.normal(-0.07, 0.2, 300)
    assert decide([Evidence("m", "higher", TOL, d)], family=1)[0].verdict == "FAIL"
    alone = float(decide([Evidence("m", "higher", TOL, d)])[0].bounds.p_fail)
    assert (decide([Evidence("m", "higher", TOL, d)], family=3)[0].verdict == "FAIL") == (alone <= 0.05 / 3)


def test_noise_margin_never_narrows_the_configured_tolerance():
    ev = Evidence("m", "higher", TOL, np.zeros(500), noise_sd=0.001)
    assert decide([ev], noise_k=3.0)[0].margin == TOL
    ev.noise_sd = 0.02
    assert decide([ev], noise_k=3.0)[0].margin == pytest.approx(0.06)


def test_refusals_and_pass_blocks():
    d = np.zeros(500)
    assert decide([Evidence("m", "higher", TOL, d, refusal="undefined")])[0].verdict == "INCONCLUSIVE"
    blocked = Evidence("m", "higher", TOL, d, pass_block="30% ended on finish=length")
    assert decide([blocked])[0].verdict == "INCONCLUSIVE" and "finish=length" in decide([blocked])[0].reason
    bad = Evidence("m", "higher", TOL, np.full(500, -0.2) + np.random.default_rng(3).normal(0, 0.1, 500),
                   pass_block="30% ended on finish=length")
    assert decide([bad])[0].verdict == "FAIL"  # shown damage stands
    assert decide([Evidence("m", "higher", TOL, np.zeros(9))])[0].verdict == "INCONCLUSIVE"
