"""Errored requests in the bounds (qverify.gate.errored, issue 35.1): a candidate whose errors fall on the items
it breaks must not PASS for it. Each test fails on the rule before, which dropped errored requests."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from qverify.gate import run_gate
from qverify.gate.bounds import paired_bounds
from qverify.gate.gate import gate_candidate
from qverify.gate.loader import RunData
from qverify.models import RunManifest, Sampling, ServingProfile, content_hash
from tests import synth

N, K, TOL = 300, 3, 0.03


def _put(wd: Path, build: str, x: np.ndarray, err: np.ndarray | None = None) -> None:
    synth.write_build(wd / "builds", build, recipe=build)
    ids = synth.item_ids("toolcall", len(x))
    synth.write_run(wd / "runs", build, "toolcall", synth.results("toolcall", ids, {"exact_call": x, "trigger": x * 0 + 1},
                                                                 errors=err))


def test_errors_on_the_lost_items_do_not_pass(tmp_path):
    """300 items x 3, the candidate loses 9 always-right items (Δ = -tol) and 17 of its 900 requests (1.9%, inside
    the 2% budget) error on 6 of them. On the answered requests only 4 items are seen lost and the bound PASSes;
    counted at their worst they show all 9, and the gate must not PASS (nor FAIL: at their best they are right)."""
    b = np.ones((N, K))
    b[200:] = 0.0  # two thirds always right, a third always wrong: the exact bound decides (few items change)
    c = b.copy()
    c[:9] = 0.0
    err = np.zeros((N, K), bool)
    err.flat[:17] = True  # items 0-4 wholly, item 5 in two of its three replicates
    seen = np.where(err, np.nan, c)
    rows = ~np.isnan(seen).all(axis=1)
    d_seen = np.nanmean(seen[rows], axis=1) - b[rows].mean(axis=1)
    assert float(paired_bounds(d_seen, TOL, 0.05, bounded=True).lower) > -TOL  # what dropping them PASSed
    _put(tmp_path, "base", b)
    _put(tmp_path, "cand", c, err)
    rep = run_gate(tmp_path, "base", ["cand"], ["toolcall"])
    m = next(x for x in rep.candidates[0].metrics if x.metric == "toolcall/exact_call")
    assert m.verdict == "INCONCLUSIVE", m.reason
    assert m.ci_low < -TOL
    assert m.details["errored_requests"] == {"baseline": 0, "candidate": 17}
    assert m.details["error_cost"]["lower"] > 0.005  # the report says what the errors cost the bound
    assert abs(m.delta - (-4 / 295)) < 1e-9  # Δ on the answered requests: items 5-8 seen lost, 0-4 dropped
    assert not rep.candidates[0].integrity  # inside the error budget: gated, not refused


def _run(build: str, x: np.ndarray, err: np.ndarray) -> RunData:
    ids = synth.item_ids("toolcall", len(x))
    m = RunManifest(build_id=build, suite="toolcall", suite_version="1", item_set_hash=content_hash(ids), n_items=len(x),
                    replicates=K, sampling=Sampling(), serving=ServingProfile(), complete=True)
    return RunData(build, "toolcall", m, ids, list(range(K)), {"exact_call": np.where(err, np.nan, x)},
                   n_results=x.size, n_errors=int(err.sum()), errored=err)


def _pass_rate(where: str, trials: int, seed: int, delta: float = -TOL, share: float = 0.019) -> float:
    rng = np.random.default_rng(seed)
    passes = 0
    for _ in range(trials):
        b, c, err = synth.lost_items_with_errors(rng, N, K, delta, share, where=where)
        rep = gate_candidate("cand", "cand", {"toolcall": _run("base", b, np.zeros_like(err))},
                             {"toolcall": _run("cand", c, err)}, {})
        passes += next(m.verdict for m in rep.metrics if m.metric == "toolcall/exact_call") == "PASS"
    return passes / trials


def test_errors_on_the_lost_items_keep_the_level():
    """The issue's situation as a rate (toolcall-like items, Δ = -tol, 1.9% of the candidate's requests erroring on
    the items it loses): dropping the errors PASSed 0.35 of 300 trials; counted at their worst, 0.04 (300 trials).
    150 trials here: PASS above 0.12 (18) fails; at a true 0.05 that is 3.9 SE away, at 0.35 the other way 7 SE."""
    assert _pass_rate("lost", 150, 351) <= 0.12


def test_an_unchanged_build_with_random_errors_still_passes():
    """Errors at random on an unchanged build cost power, not the verdict: 1% of the candidate's requests erroring
    at random, P(PASS | 0) 0.87 (100 trials; 0.98 without errors, 0.61 at 1.9%). 40 trials here, at least 0.7."""
    assert _pass_rate("random", 40, 352, delta=0.0, share=0.01) >= 0.7


def test_schema_accuracy_counts_an_answer_that_calls_no_tool(tmp_path):
    """Issue 35.5: verifier/schema_accuracy was scored only on answers that call a tool. A candidate whose calls are
    valid 80% of the time instead of 97%, and that stops calling wherever its call would be invalid, scored 100% on
    what it called and PASSed it; counted over every answer (no call = 0) it does not PASS."""
    rng = np.random.default_rng(5)
    n, k = 300, 3
    called_b = np.ones((n, k))
    valid_b = (rng.random((n, k)) < 0.97).astype(float)
    valid_c = (rng.random((n, k)) < 0.80).astype(float)
    for build, calls, valid in (("vb", called_b, valid_b), ("vc", valid_c, valid_c)):  # vc calls only when valid
        synth.write_build(tmp_path / "builds", build, recipe=build)
        scores = {"tool_call_finish": calls, "schema_accuracy": np.where(calls == 1, valid, np.nan),
                  "hygiene/empty": np.zeros((n, k))}
        synth.write_run(tmp_path / "runs", build, "verifier", synth.results("verifier", synth.item_ids("verifier", n),
                                                                            scores))
    rep = run_gate(tmp_path, "vb", ["vc"], ["verifier"])
    m = next(x for x in rep.candidates[0].metrics if x.metric == "verifier/schema_accuracy")
    assert m.verdict == "FAIL" and abs(m.candidate_mean - valid_c.mean()) < 1e-9, m.reason
