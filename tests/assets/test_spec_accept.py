"""The accept-length measure of the model card, on the committed qverify-tiny and its drafter."""

from __future__ import annotations

import json

import pytest

from qverify.assets import EMBEDDED_MODEL

pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "drafter" / "config.json").exists(), reason="no drafter")


@pytest.fixture(scope="module")
def models():
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(EMBEDDED_MODEL)
    target = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL, dtype=torch.float32)
    draft = AutoModelForCausalLM.from_pretrained(EMBEDDED_MODEL / "drafter", dtype=torch.float32)
    return target, draft, tok


@pytest.mark.slow
def test_a_drafter_that_is_always_right_reaches_the_cap(models):
    # the target as its own drafter accepts every drafted token: the measure must equal the cap computed from
    # the answers' lengths (a wrong cap formula, or a measure that drops the prefill token or the EOS, differs)
    from qverify.reference.spec_accept import measure

    target, _draft, tok = models
    m = measure(target, target, tok, n=3)
    for suite, row in m.items():
        assert row["drafter_top1"] == 1.0, suite
        assert row["accept_length"] == pytest.approx(row["max_attainable"], abs=0.01), (suite, row)
        assert row["greedy_identical"] == 1.0


def test_the_committed_drafter_is_greedy_identical_and_within_the_cap(models):
    from qverify.reference.spec_accept import measure

    target, draft, tok = models
    for suite, row in measure(target, draft, tok, n=3).items():
        assert row["greedy_identical"] == 1.0, suite  # the engine accepts only the target's own tokens
        assert 1.0 <= row["accept_length"] <= row["max_attainable"] + 1e-9, (suite, row)


def test_the_card_states_accept_length_of_3_or_more_on_every_suite():
    # issue #17's target, on the measure the card states (30 test items per suite, greedy, as served)
    acc = json.loads((EMBEDDED_MODEL / "training.json").read_text())["acceptance"]
    assert set(acc) == {"coding", "toolcall", "longctx"}
    assert all(a["greedy_identical"] == 1.0 for a in acc.values())
    assert min(a["accept_length"] for a in acc.values()) >= 3.0, {s: a["accept_length"] for s, a in acc.items()}
