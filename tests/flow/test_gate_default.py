"""`qverify gate` has one default however the builds are named (issue 36.1): budgeted rounds that resume the runs
that exist; `--fixed` is the one look at the runs as they are. And a gate that decided nothing is not uploaded
(issue 40.5). Synthetic runs through the real RunStore; qverify.rounds.gate_builds is replaced only to record
what the flow asked of it (the rounds themselves are tested in tests/test_pipeline.py on real servers)."""

from __future__ import annotations

import numpy as np
import pytest

from qverify import rounds
from qverify.config import QVerifyConfig
from qverify.errors import BadInput
from qverify.output import Output
from qverify.workdir import Workdir
from tests import synth


@pytest.fixture
def wd(tmp_path):
    wd = Workdir.at(tmp_path / "wd").ensure()
    rng = np.random.default_rng(0)
    for b in ("base", "cand"):
        synth.write_build(wd.builds, b, recipe=b)
        synth.write_run(wd.runs, b, "coding",
                        synth.results("coding", synth.item_ids("coding", 40), {"pass@1": synth.bernoulli(np.full(40, .7), 3, rng)}))
    return wd


def _asked(monkeypatch, wd, ask, cfg=None):
    seen = {}

    def fake(wd_, cfg_, base, cands, suites, budget, **kw):
        seen.update(base=base, cands=cands, suites=suites, budget=budget, **kw)
        raise SystemExit(0)

    monkeypatch.setattr(rounds, "gate_builds", fake)
    with pytest.raises(SystemExit):
        rounds.gate(wd, cfg or QVerifyConfig(suites=["coding"], report=False), ask, out=Output())
    return seen


def test_named_builds_get_the_budgeted_default_like_recipes(monkeypatch, wd):
    """Before: `fixed = fixed or budget is None` for --baseline/--candidate, so the README's production gate (no
    eval step) gated no runs and was refused, exit 3."""
    seen = _asked(monkeypatch, wd, rounds.GateAsk(baseline="base", candidates=("cand",)))
    cfg = QVerifyConfig(suites=["coding"], report=False)
    assert seen["budget"] == str(rounds.default_budget(cfg, ["coding"], 2))
    assert seen["suites"] == ["coding"] and seen["cands"] == ["cand"]


def test_fixed_is_the_runs_as_they_are(monkeypatch, wd):
    seen = _asked(monkeypatch, wd, rounds.GateAsk(baseline="base", candidates=("cand",), fixed=True))
    assert seen["budget"] is None and seen["evaluate_fixed"] is False and seen["suites"] is None
    with pytest.raises(BadInput, match="alternatives"):
        rounds.gate(wd, QVerifyConfig(suites=["coding"]), rounds.GateAsk(baseline="base", candidates=("cand",), fixed=True,
                                                                         budget="100"), out=Output())


def test_a_gate_that_decided_nothing_is_not_uploaded(wd, capsys):
    """Every suite refused ("no results"): exit 3, and no release candidate in MLflow (before: uploaded, and
    `report --compare` ranked it first)."""
    from qverify.gate.gate import run_gate

    report = run_gate(wd, "base", ["cand"], ["toolcall"], QVerifyConfig(suites=["toolcall"]), write=True)
    assert rounds.decided_nothing(report)
    assert rounds.upload_gate(wd, report, f"sqlite:///{wd.root}/mlflow.db", Output()) == 0
    assert "decided nothing" in capsys.readouterr().err
    assert not wd.mlflow_db.exists()
    decided = run_gate(wd, "base", ["cand"], ["coding"], QVerifyConfig(suites=["coding"]), write=False)
    assert not rounds.decided_nothing(decided)


def test_compare_ranks_a_gate_that_decided_nothing_below_decided_ones():
    """Issue 40.5: a refused gate (0 of 5 metrics decided, verdict INCONCLUSIVE, best KV ratio) ranked #1."""
    import pandas as pd

    from qverify.reports.compare import ranked

    rows = pd.DataFrame([
        {"build_id": "empty", "recipe": "fp8kv_nvfp4shared", "verdict": "INCONCLUSIVE", "n_decided": 0,
         "kv_tokens_ratio": 2.0, "weights_change": -0.07, "worst_delta_ratio": None, "gated_at": 2},
        {"build_id": "undecided", "recipe": "fp8kv", "verdict": "INCONCLUSIVE", "n_decided": 2,
         "kv_tokens_ratio": 1.5, "weights_change": 0.0, "worst_delta_ratio": -0.5, "gated_at": 1},
        {"build_id": "failed", "recipe": "nvfp4_all", "verdict": "FAIL", "n_decided": 3,
         "kv_tokens_ratio": 1.0, "weights_change": -0.3, "worst_delta_ratio": -2.0, "gated_at": 1},
        {"build_id": "old", "recipe": "bf16x", "verdict": "PASS", "n_decided": None,  # uploaded before n_decided
         "kv_tokens_ratio": 1.0, "weights_change": 0.0, "worst_delta_ratio": 0.1, "gated_at": 1},
    ])
    assert list(ranked(rows, "base")["build_id"]) == ["old", "undecided", "failed", "empty"]


def test_a_refusal_is_printed_once(wd):
    """Piped gate output printed each refusal twice: as `refused:` and again inside the suite's reason."""
    from qverify.gate.gate import run_gate
    from qverify.gate.render import compact_lines

    report = run_gate(wd, "base", ["cand"], ["coding", "toolcall"], QVerifyConfig(suites=["coding", "toolcall"]),
                      write=False)
    text = "\n".join(compact_lines(report, 10_000))
    assert report.candidates[0].integrity
    for refusal in report.candidates[0].integrity:
        assert text.count(refusal) == 1, text
