"""Group-sequential boundaries (qverify.gate.boundaries) against published constants and an independent method.

Published: Jennison & Turnbull (2000), Group Sequential Methods, Table 2.1 (Pocock C_P) and Table 2.3
(O'Brien-Fleming C_B), two-sided alpha = 0.05, equally spaced looks: C_P(2) = 2.178, C_P(5) = 2.413,
C_B(2) = 1.977, C_B(5) = 2.040. A one-sided test at 0.025 has the same constants to the third decimal
(the chance of crossing both sides is ~1e-6). Independent method: scipy's multivariate normal cdf
(Genz's quasi-Monte Carlo) with corr(Z_i, Z_j) = sqrt(t_i / t_j).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import optimize
from scipy import stats as sps

from qverify.gate.boundaries import LookLevels, crossing_probabilities, nominal_levels, spending


def constant_boundary(looks: int, alpha: float, shape: str = "pocock") -> list[float]:
    """Pocock (c_j = C) or O'Brien-Fleming (c_j = C sqrt(J/j)) boundaries for J equally spaced looks at
    one-sided level alpha: the published constants' definition (Jennison & Turnbull 2000, tables 2.1, 2.3)."""
    fr = [(j + 1) / looks for j in range(looks)]
    scale = [1.0 if shape == "pocock" else math.sqrt(looks / (j + 1)) for j in range(looks)]

    def size(c: float) -> float:
        return sum(crossing_probabilities(fr, [c * s for s in scale])) - alpha

    c = optimize.brentq(size, 0.5, 8.0, xtol=1e-7)
    return [c * s for s in scale]


@pytest.mark.parametrize("looks,shape,published", [(2, "pocock", 2.178), (5, "pocock", 2.413),
                                                   (2, "obf", 1.977), (5, "obf", 2.040)])
def test_published_pocock_and_obrien_fleming_constants(looks, shape, published):
    c = constant_boundary(looks, 0.025, shape)
    assert c[-1] == pytest.approx(published, abs=0.0015)
    if shape == "obf":
        assert c[0] == pytest.approx(published * np.sqrt(looks), abs=0.004)  # 4.562 at the first of 5 looks


def _mvn_any_crossing(fr: np.ndarray, crit: np.ndarray) -> float:
    cov = np.sqrt(np.minimum.outer(fr, fr) / np.maximum.outer(fr, fr))
    mvn = sps.multivariate_normal(np.zeros(len(fr)), cov, abseps=1e-6, seed=np.random.default_rng(0))
    return 1 - mvn.cdf(crit)


@pytest.mark.slow
def test_nominal_levels_spend_alpha_over_the_joint_law():
    """The chance of any crossing is alpha (multivariate normal, not the recursion), while the nominal levels
    add up to more than alpha: the union bound, which uses the spending increments as levels, is what they
    improve on."""
    fr = np.array([1, 2, 4, 6, 8, 10], float)  # unequal spacing too
    for gamma, alpha in ((1.0, 0.05), (-4.0, 0.05), (1.0, 0.0125)):
        lv = np.array(nominal_levels(tuple(fr), alpha, gamma))
        crit = sps.norm.isf(lv)
        assert _mvn_any_crossing(fr / fr[-1], crit) == pytest.approx(alpha, rel=0.01)
        assert sum(crossing_probabilities(tuple(fr / fr[-1]), list(crit))) == pytest.approx(alpha, rel=1e-3)
        incr = np.diff(np.concatenate([[0], spending(fr / fr[-1], alpha, gamma)]))
        assert lv[0] == pytest.approx(incr[0], rel=1e-6)  # the first look has no earlier one to overlap
        assert np.all(lv[1:] > incr[1:]) and lv.sum() > alpha


def test_fail_levels_shrink_with_the_family():
    at = LookLevels(tuple(float(j) for j in range(1, 9)), 3, 0.05)
    assert at.fail_level(1) == pytest.approx(at.pass_level)
    levels = [at.fail_level(k) for k in (1, 2, 4, 16)]
    assert all(a > b for a, b in itertools.pairwise(levels))
    assert levels[2] == pytest.approx(nominal_levels(at.fractions, 0.05 / 4)[2])
