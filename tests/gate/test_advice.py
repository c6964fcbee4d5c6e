"""The report's MDE and advice use the rule's own bound (issue 29): an INCONCLUSIVE metric whose estimate is no
worse than 0 must show an MDE above its tolerance (else the report claims the data could detect a tol loss that
the rule itself could not rule out). The old MDE, (t_{n-1} + z) SE, broke this in the exact regime (40 items)."""

from __future__ import annotations

import numpy as np
import pytest

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
    """40 items INCONCLUSIVE, then the same runs grown to 120 and gated again with the fixed gate (the flow's one-look
    plan, qverify.rounds.gate_builds): refused as bad input (the first gate spent the runs' alpha, qverify.gate.ledger);
    an unchanged rerun is not a second look (same gate id)."""
    from qverify.config import QVerifyConfig
    from qverify.errors import BadInput
    from qverify.rounds import gate_builds
    from qverify.workdir import Workdir
    from tests import synth

    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 0.3, 120)
    wd, cfg = Workdir.at(tmp_path), QVerifyConfig()
    full = {b: (rng.random((120, 3)) < p[:, None]).astype(float) for b in ("b", "c")}
    for n in (40, 120):
        for build in ("b", "c"):
            if n == 40:
                synth.write_build(tmp_path / "builds", build, recipe=build)
            scores = {"pass@1": full[build][:n]}
            synth.write_run(tmp_path / "runs", build, "coding", synth.results("coding", synth.item_ids("coding", n), scores))
        if n == 40:
            r, _, _ = gate_builds(wd, cfg, "b", ["c"], ["coding"], None, show_progress=False)
            again, _, _ = gate_builds(wd, cfg, "b", ["c"], ["coding"], None, show_progress=False)
            assert r.verdict == "INCONCLUSIVE" and again.gate_id == r.gate_id
    with pytest.raises(BadInput) as e:
        gate_builds(wd, cfg, "b", ["c"], ["coding"], None, show_progress=False)
    assert "is spent" in str(e.value) and "optional stopping" in str(e.value)
