"""kld/broken (issue 35.4): a build that breaks a few prompts outright must not PASS, and an unchanged one does
through the budgeted plan. Fails on the rule before, which had only kld/kld (capped) and kld/tail (3% beyond the cap)."""

from __future__ import annotations

import numpy as np

from qverify.gate import run_gate
from qverify.gate.boundaries import nominal_levels
from qverify.gate.bounds import share_bounds
from qverify.suites.kld import BROKEN_SHARE
from tests import synth

N, K = 300, 3


def _put(wd, build: str, lps) -> None:
    synth.write_build(wd / "builds", build, recipe=build)
    synth.write_run(wd / "runs", build, "kld", synth.results("kld", synth.item_ids("kld", N),
                                                             {"has_logprobs": np.ones((N, K))}, logprobs=lps))


def test_one_prompt_in_a_hundred_broken_does_not_pass(tmp_path):
    """300 items, 3 of them (1%) broken far beyond a nat, the rest as close as a good quantized build: kld/kld and
    kld/tail PASS it (the rule before), kld/broken keeps the build from PASS and names the items."""
    rng = np.random.default_rng(35)
    logits = rng.normal(0, 2, (N, 4, 8))
    _put(tmp_path, "base", synth.logprob_runs(logits, K, 0.0, 0.0, rng))
    near = synth.logprob_runs(logits, K, 0.0, 0.02, rng)
    broken = synth.logprob_runs(logits[:3] * -3, K, 0.0, 0.0, rng)  # the model's answer to these prompts inverted
    _put(tmp_path, "cand", broken + near[3:])
    rep = run_gate(tmp_path, "base", ["cand"], ["kld"])
    ms = {m.metric: m for m in rep.candidates[0].metrics}
    assert ms["kld/kld"].verdict == "PASS" and ms["kld/tail"].verdict == "PASS"
    assert ms["kld/broken"].verdict != "PASS" and rep.candidates[0].verdict != "PASS"
    assert ms["kld/broken"].details["broken_items"] == synth.item_ids("kld", 3)
    assert abs(ms["kld/broken"].candidate_mean - 0.01) < 1e-9


def _sequence_pass(share: float, trials: int, seed: int, looks: int = 12, first: int = 150) -> float:
    """P(PASS by the last look) of kld/broken under the default plan's looks (rounds of kld's 150 items, levels of a
    12-look plan), items broken independently with probability `share` (vectorised share_bounds, as rule.measure)."""
    levels = nominal_levels(tuple(float(j) for j in range(1, looks + 1)), 0.05)
    hit = np.random.default_rng(seed).random((trials, first * looks)) < share
    passed = np.zeros(trials, bool)
    for j, lv in enumerate(levels, 1):
        passed |= share_bounds(-hit[:, :first * j].astype(float), BROKEN_SHARE, lv).lower > -BROKEN_SHARE
    return float(passed.mean())


def test_the_plan_passes_an_unchanged_build_and_holds_its_level():
    """No broken item: PASS by the 12th look always (at look 6, 900 items). At the tolerance (0.5% broken) P(PASS)
    0.023 (20,000 trials): the exact bound's level holds over the looks. 1% broken: 0.0001."""
    assert _sequence_pass(0.0, 50, 1) == 1.0
    assert _sequence_pass(BROKEN_SHARE, 4000, 2) <= 0.05
    assert _sequence_pass(0.01, 2000, 3) <= 0.005
