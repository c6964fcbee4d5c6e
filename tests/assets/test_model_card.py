"""The model card is rendered from the measured files next to the weights, and the sensitivity
script knows which suites each built-in recipe can move."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from qverify.assets import EMBEDDED_MODEL
from qverify.quantize.recipe import list_recipes
from qverify.reference.model_card import card, sensitivity_table

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("quant_sensitivity", ROOT / "scripts/quant_sensitivity.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.skipif(not (EMBEDDED_MODEL / "training.json").exists(), reason="qverify-tiny not trained yet")
def test_committed_card_is_the_rendering_of_its_measurements():
    # a hand edit, or a new measurement without re-rendering, makes the card differ from its numbers
    t = json.loads((EMBEDDED_MODEL / "training.json").read_text())
    qs_path = EMBEDDED_MODEL / "quant_sensitivity.json"
    qs = json.loads(qs_path.read_text()) if qs_path.exists() else None
    assert (EMBEDDED_MODEL / "README.md").read_text() == card(t, qs)
    assert set(t["acceptance"]) == {"coding", "toolcall", "longctx"}  # accept length per suite, not coding only


def test_each_builtin_recipe_is_evaluated_on_what_it_can_change():
    suites_for = _script().suites_for
    by_name = {r.recipe.name: r.recipe for r in list_recipes() if r.builtin}
    assert suites_for(by_name["bf16"]) == ["coding", "toolcall", "longctx", "kld", "greedy"]
    assert suites_for(by_name["fp8drafter"]) == ["greedy"]  # drafter only: outputs must not change
    assert suites_for(by_name["fp8kv_badscale"]) == ["coding", "toolcall", "longctx", "kld"]
    assert suites_for(by_name["fp8kv_nvfp4shared_fp8drafter"])[-1] == "greedy"


def test_sensitivity_table_states_replicates_and_items():
    cell = {"mean": 0.5, "min": 0.4, "max": 0.6, "replicates": 3, "items": 30}
    qs = {"rows": [{"recipe": "bf16", "control": False, "cells": {"coding/pass@1": cell, "greedy/match": None},
                    "kl": None, "verdict": "baseline", "failed": []},
                   {"recipe": "fp8kv_badscale", "control": True, "cells": {"coding/pass@1": {**cell, "replicates": 1},
                    "greedy/match": None}, "kl": 0.66, "verdict": "FAIL", "failed": ["coding/pass@1"]}]}
    text = sensitivity_table(qs)
    assert "0.500 (0.40–0.60) [3×30]" in text and "0.500 [1×30]" in text
    assert "fp8kv_badscale (control)" in text and "FAIL (coding/pass@1)" in text and "0.6600" in text
