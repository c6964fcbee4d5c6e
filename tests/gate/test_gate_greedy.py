"""greedy/match: a drafter change must leave greedy outputs as reproducible as the baseline is with itself."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qverify.config import QVerifyConfig
from qverify.gate import run_gate
from qverify.gate.design import base_pairs, cross_pairs
from qverify.models import ItemResult, Response, ToolCall
from qverify.pipeline import suites_for_recipes
from tests import synth

N, K = 200, 3  # zero changed items in n bound the change at ~3.7/n: 200 items can show < 0.02


def _write(wd: Path, build: str, outputs: list[list[str]]) -> None:
    """outputs[item][replicate]: the text each run produced (one call for items whose text starts 'call:')."""
    synth.write_build(wd / "builds", build, recipe=build)
    ids = synth.item_ids("greedy", len(outputs))
    res = {}
    for r in range(len(outputs[0])):
        rows = []
        for iid, outs in zip(ids, outputs):
            o = outs[r]
            resp = (Response(content=None, tool_calls=[ToolCall(id="x", name="f", arguments=o[5:])], finish_reason="tool_calls")
                    if o.startswith("call:") else Response(content=o, finish_reason="stop"))
            rows.append(ItemResult(item_id=iid, suite="greedy", replicate=r, seed=r, request_hash="x", response=resp,
                                   scores={"completion_tokens": float(len(o))}))
        res[r] = rows
    synth.write_run(wd / "runs", build, "greedy", res)


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("greedy")
    rng = np.random.default_rng(3)
    base = [f"out-{i}" if i % 3 else f"call:{{\"i\": {i}}}" for i in range(N)]
    _write(wd, "base", [[o] * K for o in base])
    _write(wd, "drafter", [[o] * K for o in base])  # a drafter change under greedy: identical outputs
    _write(wd, "base24", [[o] * K for o in base[:24]])
    _write(wd, "drafter24", [[o] * K for o in base[:24]])
    lossy = [o + " (changed)" if rng.random() < 0.4 else o for o in base]
    _write(wd, "lossy", [[o] * K for o in lossy])
    # a stack that does not reproduce itself on 20% of items, and a candidate just as irreproducible
    flaky = [rng.random() < 0.2 for _ in range(N)]
    _write(wd, "nbase", [[o + (f" v{r}" if f else "") for r in range(K)] for o, f in zip(base, flaky)])
    _write(wd, "ncand", [[o + (f" w{r}" if f else "") for r in range(K)] for o, f in zip(base, flaky)])
    return wd


def _match(wd: Path, base: str, cand: str):
    rep = run_gate(wd, base, [cand], suites=["greedy"], config=QVerifyConfig(), write=False)
    return rep.candidates[0], next(m for m in rep.candidates[0].metrics if m.metric == "greedy/match")


def test_run_pairs_never_share_a_seed():
    assert base_pairs(3, ordered=False) == [(0, 1), (0, 2), (1, 2)]
    assert cross_pairs(3, 2) == [(0, 1), (1, 0), (2, 0), (2, 1)]  # (baseline k, candidate j), j != k
    assert cross_pairs(1, 1) == [(0, 0)]  # one run each: the same-seed pair is all there is


def test_too_few_identical_items_cannot_pass(wd):
    """24 identical greedy outputs bound a change only at ~3/24: INCONCLUSIVE, not PASS (tolerance 0.02)."""
    rep = run_gate(wd, "base24", ["drafter24"], suites=["greedy"], config=QVerifyConfig(), write=False)
    m = rep.candidates[0].metrics[0]
    assert m.delta == 0 and m.verdict == "INCONCLUSIVE" and m.ci_low < -0.02


def test_identical_greedy_outputs_pass(wd):
    cand, m = _match(wd, "base", "drafter")
    assert m.candidate_mean == pytest.approx(1.0) and m.verdict == "PASS" and cand.verdict == "PASS"


def test_changed_greedy_outputs_fail(wd):
    cand, m = _match(wd, "base", "lossy")
    assert m.candidate_mean < 0.8 and m.verdict == "FAIL" and cand.verdict == "FAIL"


def test_a_stack_that_does_not_reproduce_itself_is_the_reference(wd):
    # 20% of items differ between the baseline's own runs; a candidate no worse than that is not a failure
    _, m = _match(wd, "nbase", "ncand")
    assert m.baseline_mean < 0.9 and m.verdict != "FAIL"


def test_gate_recipe_adds_greedy_only_for_drafter_changes():
    base = ["coding", "toolcall"]
    assert suites_for_recipes(base, ["fp8drafter"]) == ["coding", "toolcall", "greedy"]
    assert suites_for_recipes(base, ["fp8kv_nvfp4shared_fp8drafter"])[-1] == "greedy"
    assert suites_for_recipes(base, ["fp8kv_nvfp4shared"]) == base
