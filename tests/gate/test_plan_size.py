"""The default request budget (qverify.gate.plan_size) as `qverify gate --recipe R` plans it with no qverify.toml.

Pure arithmetic, no runs: the whole-gate power these plans reach is benchmarks/gate_oc.py --default-plan's.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from qverify.config import QVerifyConfig
from qverify.gate.budget import make_plan
from qverify.gate.plan_size import MAX_ROUNDS, SIGMA, default_budget, plan_rounds, suite_rounds
from qverify.suites import get_suite

SUITES = QVerifyConfig().suites  # the embedded default's


def _plan(suites, overrides=None):
    cfg = QVerifyConfig()
    first = {s: get_suite(s).default_n for s in suites}
    budget = default_budget(suites, first, cfg.replicates, 2, cfg.alpha, overrides)
    return make_plan(suites, first, cfg.replicates, 2, cfg.alpha, str(budget)), first


def test_a_tol_003_rate_gets_the_items_for_fail_power_at_minus_2_tol_family_wise():
    """Old plan: 4 rounds of 60 = 240 items, where FAIL at -2 tol tested at alpha / (gated metrics) needs ~480 in a
    fixed design (P(FAIL | toolcall -2 tol) was 0.48 at the old plan)."""
    plan, _ = _plan(SUITES)
    family = sum(m.gated for s in SUITES for m in get_suite(s).gate_metrics)
    z = sps.norm.ppf(1 - plan.alpha / family) + sps.norm.ppf(0.8)
    fixed_n = (z * SIGMA / 0.03) ** 2
    assert plan.items_at("toolcall", plan.looks) >= fixed_n
    assert plan.looks <= MAX_ROUNDS


def test_sigma_covers_the_fitted_toolcall_suite_at_minus_2_tol():
    """SIGMA is the per-item SD of d for toolcall's item model fitted to the embedded suite's per-item variances
    (p ~ Beta(0.58, 0.29)), 3 replicates, half the seeds shared, every item's p scaled down by a diffuse -2 tol loss
    (benchmarks/gate_oc_fitted.py; issue 35: the "noisy" model's 0.19 was half as noisy within items)."""
    rng = np.random.default_rng(0)
    n, k = 200_000, 3
    p = rng.beta(0.5806, 0.2934, n)  # toolcall's fitted item model (benchmarks/gate_oc_fitted.py)
    q = p * (1 - 0.06 / p.mean())
    ub = rng.random((n, k))
    uc = np.where(rng.random((n, k)) < 0.5, ub, rng.random((n, k)))
    d = (uc < q[:, None]).mean(1) - (ub < p[:, None]).mean(1)
    assert abs(d.std() - SIGMA) < 0.01


def test_a_suite_that_needs_few_rounds_does_not_shorten_the_others_looks():
    """The looks are common to all suites (information fraction j/J), so J is the most rounds any suite needs;
    the old budget summed each suite's own rounds and bought their average (3 looks where kld needed 4)."""
    easy = {"toolcall/exact_call": 0.5, "toolcall/trigger": 0.5}
    plan, _ = _plan(["toolcall", "kld"], easy)
    assert plan_rounds(["toolcall"], {"toolcall": 60}, plan.alpha, easy) == 1
    family = sum(m.gated for s in ("toolcall", "kld") for m in get_suite(s).gate_metrics)
    kld = [(m.tolerance, m.cap or 1.0) for m in get_suite("kld").gate_metrics if m.gated]
    assert plan.looks == suite_rounds(kld, 150, plan.alpha, family) > 1
