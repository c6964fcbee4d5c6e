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


def test_a_fixed_gate_on_grown_runs_is_a_second_look(tmp_path):
    """40 items INCONCLUSIVE, then the same runs grown to 120 and gated again: earlier_looks names the first gate
    (the CLI refuses with exit 4 and points to the budgeted gate); an unchanged rerun is not a second look."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parents[1]))
    import synth

    from qverify.config import QVerifyConfig
    from qverify.gate.gate import run_gate
    from qverify.gate.looks import earlier_looks
    from qverify.workdir import Workdir

    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 0.3, 120)
    wd = Workdir.at(tmp_path)
    full = {b: (rng.random((120, 3)) < p[:, None]).astype(float) for b in ("b", "c")}
    for n in (40, 120):
        for build in ("b", "c"):
            if n == 40:
                synth.write_build(tmp_path / "builds", build, recipe=build)
            scores = {"pass@1": full[build][:n]}
            synth.write_run(tmp_path / "runs", build, "coding", synth.results("coding", synth.item_ids("coding", n), scores))
        r = run_gate(wd, "b", ["c"], ["coding"], QVerifyConfig())
        if n == 40:
            assert r.verdict == "INCONCLUSIVE" and earlier_looks(wd, r) == []
    assert any("on 40 items; these runs have 120" in x for x in earlier_looks(wd, r))
