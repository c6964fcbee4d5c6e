"""The default request budget (qverify.gate.plan_size) as `qverify gate --recipe R` plans it with no qverify.toml.

Pure arithmetic, no runs: the whole-gate power these plans reach is benchmarks/gate_oc.py --default-plan's.
"""

from __future__ import annotations

import numpy as np
from scipy import stats as sps

from qverify.config import MetricRule, QVerifyConfig
from qverify.gate.budget import make_plan
from qverify.gate.plan_size import MAX_ROUNDS, SEQ_INFLATION, SIGMA, default_budget, plan_rounds, suite_rounds
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


def test_sigma_covers_the_fitted_toolcall_suite_at_minus_2_tol_under_either_damage():
    """SIGMA is the larger per-item SD of d for toolcall's item model fitted to the embedded suite's per-item
    variances (p ~ Beta(0.58, 0.29)), 3 replicates, half the seeds shared, at a -2 tol loss: concentrated (random
    items always wrong: 0.287) rather than diffuse (every item's p scaled: 0.226), so the plan reaches 0.8 power for
    both (benchmarks/gate_oc_fitted.py; issue 35: sized on the diffuse 0.23, concentrated damage FAILed 0.65)."""
    rng = np.random.default_rng(0)
    n, k = 200_000, 3
    p = rng.beta(0.5806, 0.2934, n)  # toolcall's fitted item model (benchmarks/gate_oc_fitted.py)
    share = 0.06 / p.mean()
    sds = {}
    for damage, q in (("diffuse", p * (1 - share)), ("concentrated", np.where(rng.random(n) < share, 0.0, p))):
        ub = rng.random((n, k))
        uc = np.where(rng.random((n, k)) < 0.5, ub, rng.random((n, k)))
        sds[damage] = ((uc < q[:, None]).mean(1) - (ub < p[:, None]).mean(1)).std()
    assert sds["diffuse"] < sds["concentrated"]
    assert abs(max(sds.values()) - SIGMA) < 0.01


def test_the_plan_gives_toolcall_the_items_concentrated_damage_needs():
    """At the fitted model's concentrated SD (0.287, test above) a fixed design needs ~1,100 items for P(FAIL | -2 tol)
    of 0.8 family-wise, ~1,370 spread over the looks: the plan before (SIGMA 0.23, at most 16 rounds) gave toolcall
    960, and concentrated -2 tol FAILed 0.65 on the fitted models. MAX_ROUNDS must not cut it short either."""
    plan, _ = _plan(SUITES)
    family = sum(m.gated for s in SUITES for m in get_suite(s).gate_metrics)
    z = sps.norm.ppf(1 - plan.alpha / family) + sps.norm.ppf(0.8)
    assert plan.items_at("toolcall", plan.looks) >= SEQ_INFLATION * (z * 0.287 / 0.03) ** 2
    assert plan.looks <= MAX_ROUNDS


def test_a_suite_that_needs_few_rounds_does_not_shorten_the_others_looks():
    """The looks are common to all suites (information fraction j/J), so J is the most rounds any suite needs;
    the old budget summed each suite's own rounds and bought their average (3 looks where kld needed 4)."""
    easy = {"toolcall/exact_call": MetricRule(tolerance=0.5), "toolcall/trigger": MetricRule(tolerance=0.5)}
    plan, _ = _plan(["toolcall", "kld"], easy)
    assert plan_rounds(["toolcall"], {"toolcall": 60}, plan.alpha, easy) == 1
    family = sum(m.gated for s in ("toolcall", "kld") for m in get_suite(s).gate_metrics)
    kld = [(m.tolerance, m.cap or 1.0) for m in get_suite("kld").gate_metrics if m.gated]
    assert plan.looks == suite_rounds(kld, 150, plan.alpha, family) > 1


def test_the_config_s_thresholds_size_the_plan_as_the_gate_applies_them():
    """qverify.toml's [thresholds] go through the gate's own apply_rules: a metric the config ungates sizes nothing
    and leaves the FAIL family, a glob key reaches its metrics, and a tolerance of 0 is no fallback to the suite's
    (the plan before read exact names' tolerances only: toolcall/trigger ungated still needed its 24 rounds)."""
    alpha = QVerifyConfig().alpha
    loose = MetricRule(tolerance=0.5)
    only_exact = {"toolcall/exact_call": loose, "toolcall/trigger": MetricRule(gate=False)}
    assert plan_rounds(["toolcall"], {"toolcall": 60}, alpha, only_exact) == 1
    hygiene_loose = {"verifier/hygiene/*": loose, "verifier/trigger_f1": loose, "verifier/schema_accuracy": loose}
    assert plan_rounds(["verifier"], {"verifier": 60}, alpha, hygiene_loose) == 1
    assert plan_rounds(["toolcall"], {"toolcall": 60}, alpha, {"toolcall/exact_call": loose}) > 1  # trigger's 0.03
