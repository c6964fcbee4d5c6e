"""Generators: deterministic, stable ids across processes, disjoint train / held-out splits."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from qverify.suites import get_suite
from qverify.suites.bfcl_source import CATEGORIES, bfcl_items
from qverify.suites.humaneval_source import humaneval_items

SYNTHETIC = ["coding", "toolcall", "longctx", "verifier", "kld", "greedy"]


def _identity(item) -> str:
    """What makes an item the same task, whatever the ids: its prompt text."""
    if item.prompt:
        return item.prompt
    return json.dumps([m.get("content") for m in item.messages])


@pytest.mark.parametrize("name", SYNTHETIC)
def test_deterministic(name):
    suite = get_suite(name)
    a = suite.items("test", 25, seed=3)
    b = get_suite(name).items("test", 25, seed=3)
    assert [i.model_dump() for i in a] == [i.model_dump() for i in b]
    assert len({i.id for i in a}) == 25
    other = suite.items("test", 25, seed=4)
    assert [i.id for i in a] != [i.id for i in other]  # the seed matters


@pytest.mark.parametrize("name", SYNTHETIC)
def test_splits_disjoint(name):
    suite = get_suite(name)
    train = [i for seed in (0, 1) for i in suite.items("train", 150, seed=seed)]
    held = [i for seed in (0, 1) for i in suite.items("test", 60, seed=seed)]
    assert {i.split for i in train} == {"train"} and {i.split for i in held} == {"test"}
    assert not {i.id for i in train} & {i.id for i in held}
    assert not {_identity(i) for i in train} & {_identity(i) for i in held}


def test_toolcall_generator_keys_disjoint():
    # toolcall assigns splits by the request text; the same request must never be in both
    suite = get_suite("toolcall")
    train = {i.messages[0]["content"] for i in suite.items("train", 400)}
    held = {i.messages[0]["content"] for i in suite.items("test", 150)}
    assert not train & held


def test_ids_stable_across_processes():
    # ids are content hashes; content must not depend on PYTHONHASHSEED (set iteration order)
    code = (
        "import json; from qverify.suites import get_suite; "
        f"print(json.dumps({{n: [i.id for i in get_suite(n).items('test', 20)] for n in {SYNTHETIC!r}}}))"
    )
    runs = []
    for hashseed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hashseed}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout))
    assert runs[0] == runs[1]
    here = {n: [i.id for i in get_suite(n).items("test", 20)] for n in SYNTHETIC}
    assert runs[0] == here


def test_humaneval_items():
    items = humaneval_items()
    assert len(items) == 164 and len({i.id for i in items}) == 164
    assert [i.id for i in humaneval_items(5)] == [i.id for i in items[:5]]
    first = items[0]
    assert first.split == "test" and first.metadata["task_id"] == "HumanEval/0"
    assert first.target["prompt"] in first.messages[0]["content"]
    assert first.target["tests"].endswith("check(has_close_elements)")
    assert first.target["prelude"] == "from typing import List\n\n\n"
    # a helper defined before the entry point stays in the prelude
    decode = next(i for i in items if i.metadata["task_id"] == "HumanEval/38")
    assert "def encode_cyclic" in decode.target["prelude"] and "def decode_cyclic" not in decode.target["prelude"]
    assert get_suite("coding").items(source="humaneval", n=3) == items[:3]


def test_bfcl_items():
    items = bfcl_items()
    assert len(items) == 2551 and len({i.id for i in items}) == 2551
    prefix = bfcl_items(14)
    assert [i.id for i in prefix] == [i.id for i in items[:14]]
    assert [i.metadata["kind"] for i in prefix[:7]] == ["irrelevant" if c == "irrelevance" else c for c in CATEGORIES]
    assert {i.split for i in items} == {"test"}
    simple = prefix[0]
    assert simple.metadata["bfcl_id"] == "simple_python_0"
    assert simple.tools[0]["function"]["name"] == "calculate_triangle_area"
    assert simple.target["calls"] == [
        {"name": "calculate_triangle_area", "arguments": {"base": 10, "height": 5}}
    ]  # unit is optional ("")
    factorial = next(i for i in items if i.metadata["bfcl_id"] == "simple_python_1")
    assert factorial.tools[0]["function"]["name"] == "math_factorial"  # OpenAI names allow no dots
    irrelevant = prefix[4]
    assert irrelevant.metadata["kind"] == "irrelevant" and irrelevant.target["calls"] == []
    # BFCL's own types became JSON-schema types
    types = {p["type"] for i in items for t in i.tools for p in t["function"]["parameters"]["properties"].values()}
    assert types <= {"string", "integer", "number", "boolean", "array", "object"}
    assert get_suite("toolcall").items(source="bfcl", n=14) == prefix
