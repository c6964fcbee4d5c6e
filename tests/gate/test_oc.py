"""Boundary operating points of the rule, simulated (benchmarks/gate_oc.py's model), with a binomial
allowance: 2,000 trials, a rate is accepted up to alpha + 3 SE (0.05 -> 0.065). Each fails if the rule's
level is wrong at its boundary, or if looking repeatedly without alpha spending were let through."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from qverify.gate.bounds import paired_bounds
from qverify.gate.sequential import look_sizes, spending_levels

TRIALS = 2000
LIMIT = 0.05 + 3 * np.sqrt(0.05 * 0.95 / TRIALS)


@pytest.fixture(scope="module")
def oc():
    path = Path(__file__).parents[2] / "benchmarks" / "gate_oc.py"
    spec = importlib.util.spec_from_file_location("gate_oc", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gate_oc"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("damage,coupling", [("diffuse", 0.0), ("concentrated", 0.9)])
def test_false_pass_at_the_tolerance_and_false_fail_at_the_tolerance(oc, damage, coupling):
    r = oc.fixed(oc.Point(-oc.TOL, 300, 3, coupling, damage, "noisy"), TRIALS, np.random.default_rng(11))
    assert r["PASS"] <= LIMIT and r["FAIL"] <= LIMIT, r
    r0 = oc.fixed(oc.Point(0.0, 300, 3, coupling, damage, "noisy"), TRIALS, np.random.default_rng(12))
    assert r0["FAIL"] <= LIMIT and r0["PASS"] > 0.5, r0  # and it is not simply refusing everything


@pytest.mark.parametrize("n", [60, 300])
def test_ceiling_suite_with_5pct_item_loss_never_passes(oc, n):
    r = oc.fixed(oc.Point(-0.05, n, 3, 0.9, "concentrated", "ceiling"), TRIALS, np.random.default_rng(13))
    assert r["PASS"] <= LIMIT, r
    # a ceiling suite at the tolerance itself (3% of items lost): the exact bound keeps PASS at its level
    r = oc.fixed(oc.Point(-oc.TOL, n, 3, 0.9, "concentrated", "ceiling"), TRIALS, np.random.default_rng(14))
    assert r["PASS"] <= LIMIT, r


def test_error_control_under_sequential_looks(oc):
    """Ten looks at Delta = -tol: alpha spending keeps P(any PASS) <= alpha; the same looks each at
    alpha (the mistake spending prevents) exceed it, so this test can tell them apart."""
    pt = oc.Point(-oc.TOL, 0, 3, 0.5, "diffuse", "noisy")
    rng = np.random.default_rng(15)
    b, c = oc.draw(pt, TRIALS, rng, n=1000)
    d = c.mean(-1) - b.mean(-1)
    looks = look_sizes(100, 100, 1000)
    spent_pass, naive_pass = np.zeros(TRIALS, bool), np.zeros(TRIALS, bool)
    for n, level in zip(looks, spending_levels(looks, 0.05)):
        spent_pass |= paired_bounds(d[:, :n], oc.TOL, level, bounded=True).lower > -oc.TOL
        naive_pass |= paired_bounds(d[:, :n], oc.TOL, 0.05, bounded=True).lower > -oc.TOL
    assert spent_pass.mean() <= LIMIT
    assert naive_pass.mean() > 0.1
    assert sum(spending_levels(looks, 0.05)) == pytest.approx(0.05)


def test_sequential_design_stops_early_when_clear(oc):
    r = oc.sequential(oc.Point(0.0, 0, 3, 0.5, "diffuse", "noisy"), 500, np.random.default_rng(16),
                      first=100, per_round=100, max_items=1000)
    assert r["PASS"] >= 0.9 and r["median_requests"] < 2 * 3 * 1000 / 2
    r = oc.sequential(oc.Point(-oc.TOL, 0, 3, 0.5, "diffuse", "noisy"), TRIALS, np.random.default_rng(17),
                      first=100, per_round=100, max_items=1000)
    assert r["PASS"] <= LIMIT and r["FAIL"] <= LIMIT
