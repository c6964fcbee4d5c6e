"""The gate's pure statistics against scipy, known answers, and their own simulated error rates."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from qverify.gate import pairwise as pw
from qverify.gate import stats as st
from qverify.suites.kld import kl_stats
from tests.synth import logprob_runs


def _binary(p: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    return (rng.random((len(p), k)) < p[:, None]).astype(float)


def _mixed_p(n: int, rng: np.random.Generator, unstable: float = 0.3) -> np.ndarray:
    """Most items always right or always wrong; a fraction flip run to run (GPU nondeterminism, T > 0)."""
    return np.where(rng.random(n) < unstable, rng.uniform(0.2, 0.8, n), (rng.random(n) < 0.7).astype(float))


def test_bootstrap_ci_matches_scipy_t_interval_on_a_large_sample():
    rng = np.random.default_rng(0)
    d = rng.normal(0.05, 1.0, 4000)
    boot = st.paired_bootstrap(np.zeros((4000, 1)), d[:, None], n_boot=4000, seed=1)
    lo, hi = stats.t.interval(0.95, len(d) - 1, loc=d.mean(), scale=stats.sem(d))
    assert boot.delta == pytest.approx(d.mean())
    assert boot.ci_low == pytest.approx(lo, abs=0.1 * (hi - lo))
    assert boot.ci_high == pytest.approx(hi, abs=0.1 * (hi - lo))
    assert boot.se == pytest.approx(stats.sem(d), rel=0.05)


def test_two_stage_bootstrap_does_not_double_count_within_item_noise():
    """Resampling replicates within items on top of items: still the clustered SE (Miller 2024), not ~1.4x it."""
    rng = np.random.default_rng(1)
    n = 2000
    p = rng.beta(0.5, 0.5, n)
    b, c = _binary(p, 4, rng), _binary(np.clip(p - 0.05, 0, 1), 4, rng)
    d = c.mean(1) - b.mean(1)
    lo, hi = stats.t.interval(0.95, n - 1, loc=d.mean(), scale=stats.sem(d))
    boot = st.paired_bootstrap(b, c, n_boot=2000, seed=2, within=True)
    assert boot.se == pytest.approx(stats.sem(d), rel=0.08)
    assert boot.ci_low == pytest.approx(lo, abs=0.1 * (hi - lo))
    assert boot.ci_high == pytest.approx(hi, abs=0.1 * (hi - lo))


def test_bootstrap_is_seeded_and_handles_missing_replicates():
    rng = np.random.default_rng(2)
    b = _binary(rng.uniform(0, 1, 50), 3, rng)
    c = b.copy()
    c[::7, 1] = np.nan  # an infra error on some items in one replicate
    one, two = st.paired_bootstrap(b, c, 500, seed=5), st.paired_bootstrap(b, c, 500, seed=5)
    assert np.array_equal(one.draws, two.draws)
    assert np.isfinite(one.draws).all()
    assert one.delta == pytest.approx(np.mean(st.item_means(c) - st.item_means(b)))


def test_noise_band_covers_an_aa_rerun_at_the_nominal_rate():
    """The band is a 95% prediction interval for a re-run of the baseline: simulate 1500 A/A pairs."""
    rng = np.random.default_rng(3)
    inside = []
    for _ in range(1500):
        p = _mixed_p(200, rng)
        b, c = _binary(p, 3, rng), _binary(p, 4, rng)
        band = st.noise_band(st.noise_model(b), 3, 4, alpha=0.05)
        inside.append(abs(c.mean() - b.mean()) <= band)
    assert np.mean(inside) == pytest.approx(0.95, abs=0.02)


def test_band_is_simultaneous_over_m_metrics():
    rng = np.random.default_rng(4)
    noise = st.noise_model(_binary(_mixed_p(200, rng), 3, rng))
    one, ten = st.noise_band(noise, 3, 3, 0.05, 1), st.noise_band(noise, 3, 3, 0.05, 10)
    assert ten / one == pytest.approx(stats.norm.ppf(1 - 0.0025) / stats.norm.ppf(0.975), rel=0.02)


def test_noise_model_pooled_matches_direct_and_flags_run_level_noise():
    rng = np.random.default_rng(5)
    pooled, direct = [], []
    for _ in range(300):
        nz = st.noise_model(_binary(_mixed_p(150, rng), 4, rng), check_run_level=False)
        pooled.append(nz.var_run_pooled)
        direct.append(nz.var_run_direct)
    assert np.mean(direct) == pytest.approx(np.mean(pooled), rel=0.15)
    # a shift shared by every item of a run (e.g. a different kernel per server start)
    p = _mixed_p(300, rng)
    runs = np.column_stack([(rng.random(300) < np.clip(p + s, 0, 1)).astype(float) for s in (-0.1, 0.1, -0.1, 0.1, 0.0)])
    nz = st.noise_model(runs)
    assert nz.source.startswith("direct") and nz.var_run == nz.var_run_direct


def test_identical_replicates_are_deterministic_with_zero_band():
    x = np.repeat(np.array([[1.0], [0.0], [1.0]] * 10), 3, axis=1)
    nz = st.noise_model(x)
    assert nz.deterministic and st.noise_band(nz, 3, 3, 0.05) == 0.0
    assert not st.noise_model(np.array([[1.0, 0.0]] * 5)).deterministic


def test_mde_is_2_8_standard_errors():
    assert st.z_mde(0.05) == pytest.approx(2.80, abs=0.01)
    assert st.mde(0.01) == pytest.approx(0.028, abs=1e-4)


def test_advice_on_items_makes_the_mde_fit_the_tolerance():
    rng = np.random.default_rng(6)
    p = rng.uniform(0.1, 0.9, 4000)
    b, c = _binary(p[:100], 3, rng), _binary(p[:100], 3, rng)
    tol = 0.05
    se = st.paired_bootstrap(b, c, 2000, seed=1).se
    need = st.needed_for(b, c, se, tol)
    assert st.mde(se) > tol and need.items > 100 and need.replicates is not None
    n2 = need.items
    b2, c2 = _binary(p[:n2], 3, rng), _binary(p[:n2], 3, rng)
    assert st.mde(st.paired_bootstrap(b2, c2, 2000, seed=1).se) <= tol * 1.15
    k2 = need.replicates
    b3, c3 = _binary(p[:100], k2, rng), _binary(p[:100], k2, rng)
    assert st.mde(st.paired_bootstrap(b3, c3, 2000, seed=1).se) <= tol * 1.2


def test_holm_matches_known_adjustments():
    # R: p.adjust(c(0.01, 0.04, 0.03, 0.005), "holm") -> 0.03 0.06 0.06 0.02
    assert st.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert st.holm([0.5, None, 0.01]) == [pytest.approx(0.5), None, pytest.approx(0.02)]
    assert st.holm([0.9, 0.8]) == pytest.approx([1.0, 1.0])  # capped at 1
    assert st.holm([0.04, 0.02]) == pytest.approx([0.04, 0.04])  # step-down is monotone


def test_bootstrap_p_value_agrees_with_the_ci():
    rng = np.random.default_rng(7)
    boot = st.paired_bootstrap(np.zeros((300, 1)), rng.normal(-0.3, 1, (300, 1)), 4000, seed=3)
    assert (st.p_not_below(boot.draws, boot.ci_high + 1e-9) < 0.026) and st.p_not_below(boot.draws, boot.ci_high - 0.01) > 0.025
    assert st.p_two_sided_zero(boot.draws) < 0.05


def test_flips_counts_and_the_baselines_own_rate():
    b = np.array([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 0, 1], [1, 1, np.nan]], float)
    c = np.array([[0, 0, 0], [1, 0, 1], [1, 1, 1], [0, 0, 0], [0, 0, 0]], float)
    assert pw.flip_counts(b, c) == (2, 1)  # items 0 and 4 lost (a missing replicate neither confirms nor breaks), 2 gained
    f = pw.flips(b, c)
    assert f["regressed"] == 2 and f["improved"] == 1 and f["rate"] == pytest.approx(3 / 5)
    # baseline halves {0}|{1,2}, {1}|{0,2}, {2}|{0,1}: item 3 (1,0,1) flips only in the second split
    assert f["baseline_rate"] == pytest.approx((0 + 1 / 5 + 0) / 3)


def test_mcnemar_is_the_exact_binomial_on_discordant_items():
    assert pw.mcnemar_p(9, 1) == pytest.approx(stats.binomtest(9, 10, 0.5).pvalue)
    assert pw.mcnemar_p(0, 0) == 1.0
    assert pw.mcnemar_p(5, 5) == pytest.approx(1.0)


def test_trigger_f1_counts_as_k2vv_and_pseudo_values_linearise_it():
    ref = np.array([1, 1, 1, 0, 0, 0, 1, np.nan], float)
    pred = np.array([1, 1, 0, 1, 0, 0, 1, 1], float)
    assert pw.trigger_counts(ref, pred) == {"tp": 3, "fp": 1, "fn": 1, "tn": 2}
    assert pw.trigger_f1(ref, pred) == pytest.approx(2 * 3 / (2 * 3 + 1 + 1))
    pv = pw.f1_pseudo(ref, pred)
    assert np.isnan(pv[-1]) and np.nanmean(pv) == pytest.approx(0.75)
    assert pv[2] < pv[4] < pv[0]  # a miss pulls F1 down, a true negative is neutral, a hit lifts it
    assert pw.trigger_f1(np.zeros(4), np.zeros(4)) == 1.0  # neither run ever calls: perfect agreement
    # the pseudo-values' item bootstrap reproduces the bootstrap of F1 itself
    rng = np.random.default_rng(8)
    r = (rng.random(400) < 0.6).astype(float)
    p = np.where(rng.random(400) < 0.15, 1 - r, r)
    direct = [pw.trigger_f1(r[i], p[i]) for i in rng.integers(0, 400, (2000, 400))]
    se = st.paired_bootstrap(np.zeros((400, 1)), pw.f1_pseudo(r, p)[:, None], 2000, seed=1).se
    assert se == pytest.approx(np.std(direct), rel=0.1)


def test_k2vv_floor_is_the_lowest_f1_between_baseline_runs_minus_a_margin():
    rng = np.random.default_rng(9)
    truth = (rng.random(200) < 0.5).astype(float)
    runs = np.column_stack([np.where(rng.random(200) < e, 1 - truth, truth) for e in (0.05, 0.1, 0.2)])
    between = pw.f1_between(runs)
    assert len(between) == 3 and pw.f1_floor(runs, 0.03) == pytest.approx(min(between) - 0.03)
    ybase, xcand = pw.trigger_matrices(runs, runs[:, :1])
    assert ybase.shape == (200, 3) and xcand.shape == (200, 3)
    assert np.nanmean(ybase, axis=0) == pytest.approx(between)


def test_fast_kl_stats_equals_the_suites_kl_stats():
    """The gate's vectorised KL is qverify.suites.kld.kl_stats, token for token, edge cases included."""
    rng = np.random.default_rng(11)
    logits = rng.normal(0, 2, (4, 40, 12))
    runs = logprob_runs(logits, 2, run_noise=0.7, shift=0.3, rng=rng)
    a, b = runs[0][0], runs[1][1][:30]  # different items: top sets differ a lot; lengths differ
    b = [dict(t) for t in b]
    b[3] = {**b[3], "top": {}}  # no top-k for a token
    b[4] = {**b[4], "logprob": None}
    b[5] = {**b[5], "top": dict(list(b[5]["top"].items())[:2])}  # fewer than k
    tie = {"token": "x", "logprob": -0.7, "top": {"t1": -0.7, "t2": -0.7, "t3": -3.0}}
    for x, y in ((a, b), (b, a), (runs[2][0], runs[2][1]), ([tie] * 3, [tie] * 3), (a, [])):
        vocab: dict[str, int] = {}
        want = kl_stats(x, y)
        got = pw.fast_kl_stats(pw.encode(x, vocab), pw.encode(y, vocab), ("kld", "same_top", "dp_rms", "kld_p99"))
        assert got.keys() >= want.keys() - {"dp_mean"} or not want
        for k, v in want.items():
            assert got[k] == pytest.approx(v, rel=1e-9, abs=1e-12), k


def test_kld_matrices_from_logprobs():
    rng = np.random.default_rng(10)
    logits = rng.normal(0, 2, (6, 12, 16))
    base = logprob_runs(logits, 3, run_noise=0.0, shift=0.0, rng=rng)
    near = logprob_runs(logits, 2, run_noise=0.0, shift=0.05, rng=rng)
    far = logprob_runs(logits, 2, run_noise=0.0, shift=1.0, rng=rng)
    keys = ["kld", "same_top"]
    m_near = pw.kld_matrices(base, near, keys)
    m_far = pw.kld_matrices(base, far, keys)
    b, c = m_near["kld"]
    assert b.shape == (6, 6) and c.shape == (6, 6)  # 3*2 ordered baseline pairs, 3*2 (base, cand) pairs
    assert np.allclose(b, 0.0)  # a deterministic baseline has no KL to itself
    assert 0 < c.mean() < m_far["kld"][1].mean()
    assert m_far["same_top"][1].mean() < m_near["same_top"][1].mean() <= 1.0
    assert c[0, 0] == pytest.approx(kl_stats(base[0][0], near[0][0])["kld"])
    assert np.isnan(pw.kld_matrices(base, [[None, None]] * 6, keys)["kld"][1]).all()
