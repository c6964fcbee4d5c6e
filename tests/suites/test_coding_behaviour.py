"""Coding items: held-out splits are distinct from train by behaviour, and hidden tests catch near-misses.

Everything here runs our own generated reference programs (trusted code).
"""

from __future__ import annotations

import random

import pytest

from qverify.models import Item
from qverify.suites import coding_check, coding_gen
from qverify.suites.base import split_of
from qverify.suites.coding import CodingSuite


@pytest.fixture(scope="module")
def splits():
    suite = CodingSuite()
    return {s: [i for seed in (0, 1) for i in suite.items(s, n, seed=seed)]
            for s, n in (("train", 300), ("validation", 60), ("test", 60))}


def test_normalized_program_ignores_names_and_docstrings():
    a = "def tally_value(xs):\n    return sum(x * x for x in xs if x % 2 == 1)"
    b = 'def pick_node(nums):\n    """Odd squares."""\n    return sum(y * y for y in nums if y % 2 == 1)'
    c = "def pick_node(nums):\n    return sum(y * y for y in nums if y % 2 == 0)"
    assert coding_check.normalized_program(a) == coding_check.normalized_program(b)
    assert coding_check.normalized_program(a) != coding_check.normalized_program(c)


def test_signature_is_behaviour_not_text():
    ge = "def f(xs):\n    return [x for x in xs if x >= 3]"
    gt = "def g(values):\n    out = []\n    for v in values:\n        if v > 2:\n            out.append(v)\n    return out"
    off = "def f(xs):\n    return [x for x in xs if x > 3]"
    assert coding_check.signature(ge, "f", "list") == coding_check.signature(gt, "g", "list")
    assert coding_check.signature(ge, "f", "list") != coding_check.signature(off, "f", "list")


def test_held_out_splits_share_no_program_or_signature_with_train(splits):
    assert coding_check.leaks(splits["train"], splits["validation"]) == []
    assert coding_check.leaks(splits["train"], splits["test"]) == []
    assert coding_check.leaks(splits["validation"], splits["test"]) == []
    for name, items in splits.items():  # within a split, every item is a distinct behaviour
        sigs = [coding_check.identity(i)[1] for i in items[: len(items) // 2]]
        assert len(set(sigs)) == len(sigs), name
        assert {i.split for i in items} == {name}


def test_leak_check_catches_a_training_item_planted_in_test(splits):
    train, test = splits["train"], splits["test"]
    victim = train[7]
    # the same task under another function name: a different prompt and id, the same program up to names
    renamed = victim.target["code"].replace(victim.target["entry_point"], "renamed_fn")
    planted = Item.make("coding", "test", messages=[{"role": "user", "content": "planted"}],
                        target={**victim.target, "code": renamed, "entry_point": "renamed_fn"})
    assert coding_check.leaks(train, test + [planted]) == [(planted.id, "program")]
    # the same behaviour written differently: only the signature can see it
    arg = victim.target["code"].split("(", 1)[1].split(")", 1)[0]
    wrapped = (f"def other({arg}):\n    return _inner({arg})\n\n"
               + victim.target["code"].replace(f"def {victim.target['entry_point']}(", "def _inner(", 1))
    twin = Item.make("coding", "test", messages=[{"role": "user", "content": "twin"}],
                     target={**victim.target, "code": wrapped, "entry_point": "other"})
    assert coding_check.leaks(train, test + [twin]) == [(twin.id, "signature")]


def test_splitting_by_text_would_leak():
    """The check can fail: the first generator's split key (the reference code's text) puts the
    same behaviour under different names into both splits, and `leaks` reports it."""
    rng = random.Random(0)
    by_text: dict[str, list] = {"train": [], "test": []}
    for _ in range(3000):
        fam, p, name, arg = coding_gen.draw(rng, rng.choice([1, 2]))
        spec = coding_gen.build(fam, p, name, arg)
        split = split_of(spec.reference())
        if split in by_text:
            by_text[split].append(Item.make("coding", split, messages=[{"role": "user", "content": spec.reference()}],
                                            target={"code": spec.reference(), "entry_point": name, "arg_kind": spec.kind}))
    assert len(coding_check.leaks(by_text["train"], by_text["test"])) > 10


def test_every_reference_passes_its_hidden_tests(splits):
    for item in splits["test"] + splits["validation"]:
        exec(item.target["code"] + "\n" + item.target["tests"], {})


def test_hidden_tests_catch_near_misses():
    """A program one choice away (another filter, map, reducer, threshold, comparison) that
    behaves differently on any of 200 fresh inputs must fail the item's hidden tests."""
    rng = random.Random(5)
    differing = caught = 0
    for _ in range(120):
        fam, p, name, arg = coding_gen.draw(rng, rng.choice([1, 2, 3, 4]))
        spec = coding_gen.with_tests(fam, p, coding_gen.build(fam, p, name, arg), rng)
        tests = coding_gen.test_program(name, spec.tests)
        ref = coding_check.compile_function(spec.reference(), name)
        fresh = coding_gen.input_pool(random.Random(1), fam.kind, 200)
        for q in coding_gen.neighbours(fam, p):
            code = coding_gen.build(fam, q, name, arg).reference()
            near = coding_check.compile_function(code, name)
            if all(coding_check.outcome(near, a) == coding_check.outcome(ref, a) for a in fresh):
                continue  # the same behaviour: not a miss
            differing += 1
            try:
                exec(code + "\n" + tests, {})
            except AssertionError:
                caught += 1
    assert differing > 500
    assert caught / differing >= 0.99, (caught, differing)


def test_generation_reports_dropped_duplicates():
    items, stats = CodingSuite().generate("test", 40, 0)
    assert len(items) == 40 and stats["drawn"] == 40 + stats["other_split"] + stats["duplicate_behaviour"]
    assert stats["duplicate_behaviour"] > 0


@pytest.mark.slow
@pytest.mark.parametrize(("split", "seed"), [("test", 0), ("test", 7), ("validation", 0), ("train", 0)])
def test_a_split_gives_its_declared_supply_and_no_more(split, seed):
    """The synthetic source is finite: asked for more than a split has, it gives exactly its supply (the gate then
    reports the suite exhausted) instead of raising as it did (a 12-look default gate asked kld for 300, hence
    coding for 300, and ended exit 3 at look 2). Seeds 0 (coding, greedy) and 7 (kld) are the ones gating uses."""
    from qverify.suites.coding import SUPPLY

    items = CodingSuite().items(split, SUPPLY[split] + 500, seed)
    assert len(items) == SUPPLY[split] and len({i.id for i in items}) == SUPPLY[split]
    assert CodingSuite().items(split, 50, seed) == items[:50]  # extended, never redrawn


@pytest.mark.slow
def test_kld_past_codings_supply_fills_with_tool_items():
    from qverify.suites.coding import SUPPLY
    from qverify.suites.kld import KLDSuite

    n = SUPPLY["test"] + 100
    items = KLDSuite().items("test", n)
    assert len(items) == n and len({i.id for i in items}) == n
    assert items[:150] == KLDSuite().items("test", 150)  # the default items are unchanged: runs grow, not redraw
    assert {i.metadata["from"] for i in items[SUPPLY["test"]:]} == {"kld"}  # toolcall-style items past coding's


@pytest.mark.slow
def test_greedy_past_codings_supply_stays_half_coding():
    """greedy's derived tolerance assumes half its items are coding: past coding's supply it stops at 2 x supply
    (the gate reports it exhausted) instead of filling with tool items."""
    from qverify.suites.coding import SUPPLY
    from qverify.suites.greedy import GreedySuite

    items = GreedySuite().items("test", 2 * SUPPLY["test"] + 100)
    sources = [i.metadata["from"] for i in items]
    assert len(items) == 2 * SUPPLY["test"] and sources.count("coding") == sources.count("toolcall") == SUPPLY["test"]
    small = GreedySuite().items("test", 24)  # the default items are unchanged
    assert [i.metadata["from"] for i in small] == ["coding"] * 12 + ["toolcall"] * 12
