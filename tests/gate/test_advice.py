"""The report's MDE and advice use the rule's own bound (issue 29): an INCONCLUSIVE metric whose estimate is no
worse than 0 must show an MDE above its tolerance (else the report claims the data could detect a tol loss that
the rule itself could not rule out). The old MDE, (t_{n-1} + z) SE, broke this in the exact regime (40 items)."""

from __future__ import annotations

import numpy as np

from qverify.gate.decide import result
from qverify.gate.rule import Evidence, decide


def test_mde_is_the_rules_own_and_the_advice_names_the_budgeted_gate():
    rng = np.random.default_rng(4)
    seen = 0
    for _ in range(300):
        p = rng.beta(0.3, 0.3, 40)
        b = (rng.random((40, 3)) < p[:, None]).mean(1)
        c = (rng.random((40, 3)) < p[:, None]).mean(1)
        dc = decide([Evidence("s/acc", "higher", 0.10, c - b, bounded=True)])[0]
        m = result(dc, 0.05)
        if m.verdict == "INCONCLUSIVE" and m.delta >= 0:
            seen += 1
            assert m.mde > m.tolerance, (m.delta, m.ci_low, m.mde)
            assert "budgeted gate" in m.advice and "optional stopping" in m.advice
    assert seen >= 10
