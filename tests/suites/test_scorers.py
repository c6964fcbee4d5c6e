"""Every scorer on hand-checked good and bad responses. Scorers must never raise."""

from __future__ import annotations

import json
import math

import pytest

from qverify.chatfmt import format_tool_calls
from qverify.models import Item, Response, ToolCall
from qverify.suites import get_suite
from qverify.suites.bfcl_source import bfcl_items, bfcl_match
from qverify.suites.coding import build_program, extract_code
from qverify.suites.kld import kl_stats, token_kl
from qverify.suites.sandbox import sandbox_kind
from qverify.suites.toolcall_gen import TOOLS
from qverify.suites.verifier import has_repetition_loop

needs_sandbox = pytest.mark.skipif(sandbox_kind() != "bwrap", reason="needs bubblewrap")


def call(name: str, args) -> ToolCall:
    return ToolCall(name=name, arguments=args if isinstance(args, str) else json.dumps(args))


# --------------------------------------------------------------------------- coding

CODING_ITEM = Item.make(
    "coding",
    "test",
    messages=[{"role": "user", "content": "Write `scale_value(x)` that returns x * 3."}],
    target={"tests": "assert scale_value(2) == 6\nassert scale_value(-1) == -3", "entry_point": "scale_value"},
    metadata={"level": 1},
)
GOOD = "def scale_value(x):\n    return x * 3"


def test_extract_code():
    assert extract_code(f"Here you go:\n```python\n{GOOD}\n```\nDone.") == GOOD
    assert extract_code(f"```\n{GOOD}\n```") == GOOD
    assert extract_code(f"```py\n{GOOD}") == GOOD  # unclosed fence (truncated answer)
    assert extract_code(GOOD + "\n") == GOOD
    assert extract_code("") == ""


def test_build_program_rules():
    humaneval = {
        "prompt": 'import math\n\n\ndef f(x):\n    """doc"""\n',
        "prelude": "import math\n\n\n",
        "entry_point": "f",
        "tests": "assert f(4) == 2",
    }
    full = build_program(humaneval, "def f(x):\n    return math.isqrt(x)")
    assert full.startswith("import math\n\n\ndef f(x):\n    return math.isqrt(x)") and full.count("def f(") == 1
    body = build_program(humaneval, "    return math.isqrt(x)")
    assert body.startswith(humaneval["prompt"] + "    return math.isqrt(x)")
    unindented = build_program(humaneval, "y = math.isqrt(x)\nreturn y")
    assert humaneval["prompt"] + "    y = math.isqrt(x)\n    return y" in unindented
    assert build_program(CODING_ITEM.target, GOOD) == f"{GOOD}\n\n{CODING_ITEM.target['tests']}\n"


@needs_sandbox
@pytest.mark.parametrize(
    "content, passed, reason",
    [
        (f"```python\n{GOOD}\n```", True, None),
        (GOOD, True, None),
        ("```python\ndef scale_value(x):\n    return x * 2\n```", False, "AssertionError"),
        ("```python\ndef scale_value(x):\n    return '6'\n```", False, "AssertionError"),  # wrong type
        ("```python\ndef other(x):\n    return x * 3\n```", False, "NameError: name 'scale_value' is not defined"),
        ("<|tool_calls_section_begin|>" + GOOD, False, "SyntaxError"),  # leaked markup
        ("def scale_value(x):\n    return x * 3 x * 3 x * 3 x * 3 x * 3", False, "SyntaxError"),  # repetition
        ("", False, "empty response"),
        ("```python\n\n```", False, "empty response"),
    ],
)
def test_coding_scorer(content, passed, reason):
    s = get_suite("coding").score(CODING_ITEM, Response(content=content))
    if reason == "empty response":  # nothing to run: no sandbox, no level breakdown
        assert s.values == {"pass@1": 0.0}
    else:
        assert s.values["pass@1"] == s.values["pass@1/level1"] == float(passed)
        assert s.values["sandboxed"] == 1.0
    if reason is None:
        assert s.reason is None
    else:
        assert s.reason is not None and s.reason.startswith(reason), s.reason


@needs_sandbox
def test_coding_scorer_none_content():
    s = get_suite("coding").score(CODING_ITEM, Response(content=None))
    assert s.values == {"pass@1": 0.0} and s.reason == "empty response"


# --------------------------------------------------------------------------- toolcall


def _tc_item(calls, offered=("read_file", "git_log", "write_file"), kind="single") -> Item:
    return Item.make(
        "toolcall",
        "test",
        messages=[{"role": "user", "content": "do it"}],
        tools=[TOOLS[t][0] for t in offered],
        target={"calls": calls, "no_tool_answer": "None of the available tools can do that."},
        metadata={"kind": kind},
    )


READ = {"name": "read_file", "arguments": {"path": "src/a/b.py", "start_line": 3}}
LOG = {"name": "git_log", "arguments": {"count": 5}}


@pytest.mark.parametrize(
    "calls, expected, values, reason",
    [
        (
            [call("read_file", {"path": "src/a/b.py", "start_line": 3})],
            [READ],
            {"trigger": 1, "schema_valid": 1, "exact_call": 1},
            None,
        ),
        (
            [call("read_file", '{"start_line": 3, "path": "src/a/b.py"}')],
            [READ],  # key order is irrelevant
            {"trigger": 1, "schema_valid": 1, "exact_call": 1},
            None,
        ),
        (
            [call("read_file", {"path": "src/a/b.py", "start_line": "3"})],
            [READ],  # wrong type
            {"trigger": 1, "schema_valid": 0, "exact_call": 0},
            "read_file arguments invalid: '3' is not of type 'integer'",
        ),
        (
            [call("read_file", '{"path": "src/a/b.py", "start_line": 3')],
            [READ],  # malformed JSON
            {"trigger": 1, "schema_valid": 0, "exact_call": 0},
            "arguments of read_file are not JSON",
        ),
        (
            [call("read_file", "[]")],
            [READ],  # JSON, but not an object
            {"trigger": 1, "schema_valid": 0, "exact_call": 0},
            "read_file arguments invalid",
        ),
        (
            [call("read_file", {"path": "src/a/c.py", "start_line": 3})],
            [READ],  # wrong value
            {"trigger": 1, "schema_valid": 1, "exact_call": 0},
            "calls differ",
        ),
        (
            [call("delete_file", {"path": "src/a/b.py"})],
            [READ],
            {"trigger": 1, "schema_valid": 0, "exact_call": 0},
            "called delete_file, which was not offered",
        ),
        ([], [READ], {"trigger": 0, "exact_call": 0}, "no tool call where one was expected"),
        ([], [], {"trigger": 1, "exact_call": 1}, None),
        (
            [call("git_log", {"count": 5})],
            [],
            {"trigger": 0, "schema_valid": 1, "exact_call": 0},
            "called a tool where none fits",
        ),
        (
            [call("git_log", {"count": 5}), call("read_file", {"path": "src/a/b.py", "start_line": 3})],
            [READ, LOG],
            {"trigger": 1, "schema_valid": 1, "exact_call": 1},
            None,
        ),  # parallel calls in any order
        (
            [call("git_log", {"count": 5})],
            [READ, LOG],
            {"trigger": 1, "schema_valid": 1, "exact_call": 0},
            "calls differ",
        ),
    ],
)
def test_toolcall_scorer(calls, expected, values, reason):
    s = get_suite("toolcall").score(
        _tc_item(expected), Response(tool_calls=calls, finish_reason="tool_calls" if calls else "stop")
    )
    for k, v in values.items():
        assert s.values[k] == v, (k, s.values)
    assert s.values["exact_call/single"] == values["exact_call"]
    if reason is None:
        assert s.reason is None
    else:
        assert s.reason is not None and reason in s.reason, s.reason


def test_toolcall_leaked_markup_is_no_call():
    # markup the server failed to parse arrives as content: no call, so no credit
    text = format_tool_calls([READ])
    s = get_suite("toolcall").score(_tc_item([READ]), Response(content=text, finish_reason="stop"))
    assert s.values["trigger"] == 0 and s.values["exact_call"] == 0


# --------------------------------------------------------------------------- BFCL matching


@pytest.fixture(scope="module")
def bfcl():
    return {i.metadata["bfcl_id"]: i for i in bfcl_items()}


@pytest.mark.parametrize(
    "bfcl_id, calls, exact",
    [
        ("simple_python_0", [("calculate_triangle_area", {"base": 10, "height": 5})], True),
        (
            "simple_python_0",
            [("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})],
            True,
        ),  # case-insensitive
        ("simple_python_0", [("calculate_triangle_area", {"base": 10, "height": 5, "unit": "meters"})], False),
        ("simple_python_0", [("calculate_triangle_area", {"base": "10", "height": 5})], False),  # wrong type
        ("simple_python_0", [("calculate_triangle_area", {"base": 10})], False),  # missing required
        ("simple_python_0", [("calculate_triangle_area", {"base": 10, "height": 5, "color": "red"})], False),
        ("simple_python_1", [("math_factorial", {"number": 5})], True),
        ("simple_python_1", [("math.factorial", {"number": 5})], False),  # the offered name has no dot
        (
            "parallel_0",
            [
                ("spotify_play", {"artist": "Maroon 5", "duration": 15}),
                ("spotify_play", {"artist": "Taylor Swift", "duration": 20}),
            ],
            True,
        ),  # any order
        ("parallel_0", [("spotify_play", {"artist": "Maroon 5", "duration": 15})], False),  # one missing
        ("multiple_0", [("triangle_properties_get", {"side1": 5, "side2": 4, "side3": 3, "get_area": True})], True),
        ("multiple_0", [("circle_properties_get", {"radius": 3})], False),
        ("live_simple_0-0-0", [("get_user_info", {"user_id": 7890, "special": "black"})], True),
    ],
)
def test_bfcl_matching(bfcl, bfcl_id, calls, exact):
    item = bfcl[bfcl_id]
    ok, why = bfcl_match(item.target["acceptable"], calls)
    assert ok == exact, why
    s = get_suite("toolcall").score(
        item, Response(tool_calls=[call(n, a) for n, a in calls], finish_reason="tool_calls")
    )
    assert s.values["exact_call"] == float(exact) and s.values[f"exact_call/{item.metadata['kind']}"] == float(exact)
    assert (s.reason is None) == exact


def test_bfcl_malformed_and_irrelevance(bfcl):
    suite = get_suite("toolcall")
    item = bfcl["simple_python_0"]
    bad = suite.score(
        item, Response(tool_calls=[call("calculate_triangle_area", '{"base": 10,')], finish_reason="tool_calls")
    )
    assert bad.values["exact_call"] == 0 and "not JSON" in bad.reason
    listy = suite.score(
        item, Response(tool_calls=[call("calculate_triangle_area", "[10, 5]")], finish_reason="tool_calls")
    )
    assert listy.values["exact_call"] == 0
    irrelevant = bfcl["irrelevance_0"]
    assert suite.score(irrelevant, Response(content="I cannot help with that.")).values["exact_call"] == 1
    called = suite.score(
        irrelevant, Response(tool_calls=[call("determine_body_mass_index", {"weight": 1.0, "height": 2.0})])
    )
    assert called.values["exact_call"] == 0 and called.reason == "called a tool where none fits"


def test_bfcl_reference_calls_match_their_own_answers(bfcl):
    # the representative call we derive per item must satisfy BFCL's checker; the only
    # exceptions are BFCL data quirks (a required argument with no acceptable value, ...)
    known_quirks = {
        "live_simple_106-63-0",
        "live_simple_112-68-0",
        "live_multiple_507-149-4",
        "live_multiple_862-181-3",
        "live_multiple_964-207-0",
    }
    rejected = {
        bid
        for bid, it in bfcl.items()
        if not bfcl_match(it.target["acceptable"], [(c["name"], c["arguments"]) for c in it.target["calls"]])[0]
    }
    assert rejected <= known_quirks


# --------------------------------------------------------------------------- longctx

LC_ITEM = Item.make(
    "longctx",
    "test",
    messages=[{"role": "user", "content": "... What are the values?"}],
    target={"answer": ["CACHE_SIZE = 4821", "POOL_LIMIT = 1937"]},
    metadata={"length": 256, "task": "multiquery"},
)


@pytest.mark.parametrize(
    "content, accuracy, recall",
    [
        ("CACHE_SIZE = 4821\nPOOL_LIMIT = 1937", 1, 1),
        ("POOL_LIMIT=1937 and CACHE_SIZE = 4821.", 1, 1),
        ("CACHE_SIZE = 4821\nPOOL_LIMIT = 1938", 0, 0.5),
        ("CACHE_SIZE = 482", 0, 0),
        ("", 0, 0),
        ("<|tool_calls_section_begin|>CACHE_SIZE = 4821 " * 5, 0, 0.5),
    ],
)
def test_longctx_scorer(content, accuracy, recall):
    s = get_suite("longctx").score(LC_ITEM, Response(content=content))
    assert s.values["accuracy"] == accuracy and s.values["recall"] == recall and s.values["accuracy@256"] == accuracy
    assert (s.reason is None) == bool(accuracy)


# --------------------------------------------------------------------------- verifier


def test_verifier_scorer():
    suite = get_suite("verifier")
    item = _tc_item([LOG])
    good = suite.score(item, Response(tool_calls=[call("git_log", {"count": 5})], finish_reason="tool_calls"))
    assert good.values["finish/tool_calls"] == 1 and good.values["tool_call_finish"] == 1
    assert good.values["schema_accuracy"] == 1 and good.reason is None
    assert all(v == 0 for k, v in good.values.items() if k.startswith("hygiene/"))

    wrong_type = suite.score(
        item, Response(tool_calls=[call("git_log", {"count": "five"})], finish_reason="tool_calls")
    )
    assert wrong_type.values["schema_accuracy"] == 0 and "'five' is not of type 'integer'" in wrong_type.reason
    malformed = suite.score(item, Response(tool_calls=[call("git_log", "{count: 5}")], finish_reason="tool_calls"))
    assert malformed.values["schema_accuracy"] == 0 and "not JSON" in malformed.reason
    no_calls = suite.score(item, Response(content="", finish_reason="tool_calls"))
    assert no_calls.values["schema_accuracy"] == 0 and no_calls.values["hygiene/empty"] == 1

    stop = suite.score(item, Response(content="Sure.", finish_reason="stop"))
    assert stop.values["finish/stop"] == 1 and "schema_accuracy" not in stop.values and stop.reason is None
    leak = suite.score(item, Response(content="ok <|tool_call_begin|>functions.git_log:0", finish_reason="stop"))
    assert leak.values["hygiene/leaked_markup"] == 1 and "hygiene/leaked_markup" in leak.reason
    special = suite.score(item, Response(content="done<|im_end|>", finish_reason="stop"))
    assert special.values["hygiene/leaked_markup"] == 1
    trunc = suite.score(item, Response(content="I will now", finish_reason="length"))
    assert trunc.values["finish/length"] == 1 and trunc.values["hygiene/truncated"] == 1
    loop = suite.score(item, Response(content="let me check " * 6, finish_reason="stop"))
    assert loop.values["hygiene/repetition"] == 1
    other = suite.score(item, Response(content="x", finish_reason="content_filter"))
    assert other.values["finish/other"] == 1
    empty = suite.score(item, Response(content=None, finish_reason=None))
    assert empty.values["hygiene/empty"] == 1 and empty.values["finish/other"] == 1


def test_repetition_detector():
    assert has_repetition_loop("abcd" * 4)
    assert not has_repetition_loop("abcd" * 3)
    assert not has_repetition_loop("The quick brown fox jumps over the lazy dog.")


# --------------------------------------------------------------------------- kld


def test_token_kl_hand_computed():
    ln = math.log
    base = {"a": ln(0.5), "b": ln(0.3)}
    # same top-k sets: exact KL over {a, b, tail}
    cand = {"a": ln(0.4), "b": ln(0.4)}
    want = 0.5 * ln(0.5 / 0.4) + 0.3 * ln(0.3 / 0.4) + 0.2 * ln(0.2 / 0.2)
    assert token_kl(base, cand) == pytest.approx(want)
    # b missing from cand's top-k: cand's rest mass 0.1 split between b and the tail
    cand2 = {"a": ln(0.6), "c": ln(0.3)}
    want2 = 0.5 * ln(0.5 / 0.6) + 0.3 * ln(0.3 / 0.05) + 0.2 * ln(0.2 / 0.35)
    assert token_kl(base, cand2) == pytest.approx(want2)
    assert token_kl(base, base) == pytest.approx(0.0, abs=1e-12)


def test_kl_stats_hand_computed():
    ln = math.log
    base = [
        {"token": "a", "logprob": ln(0.5), "top": {"a": ln(0.5), "b": ln(0.3)}},
        {"token": "b", "logprob": ln(0.3), "top": {"a": ln(0.5), "b": ln(0.3)}},
        {"token": "x", "logprob": None, "top": None},
    ]  # first prompt token: servers return no logprob
    cand = [
        {"token": "a", "logprob": ln(0.5), "top": {"a": ln(0.5), "b": ln(0.3)}},
        {"token": "b", "logprob": ln(0.45), "top": {"b": ln(0.45), "a": ln(0.35)}},
        {"token": "x", "logprob": None, "top": None},
    ]
    s = kl_stats(base, cand)
    kl2 = 0.5 * ln(0.5 / 0.35) + 0.3 * ln(0.3 / 0.45)  # tails: 0.2 vs 0.2 contribute 0
    assert s["n_tokens"] == 2
    assert s["kld"] == pytest.approx(kl2 / 2)
    assert s["kld_p99"] == pytest.approx(0.99 * kl2)  # numpy's linear interpolation between 0 and kl2
    assert s["same_top"] == pytest.approx(0.5)  # token 2: base's top is a, cand's is b
    assert s["dp_mean"] == pytest.approx(0.075)  # (0 + (0.45 - 0.3)) / 2
    assert s["dp_rms"] == pytest.approx(math.sqrt(0.15**2 / 2))
    assert kl_stats([], []) == {}


def test_kld_scorer():
    suite = get_suite("kld")
    item = suite.items(n=1)[0]
    assert suite.score(item, Response(logprobs=None)).values == {"has_logprobs": 0.0}
    assert suite.score(item, Response(logprobs=[{"token": "a", "logprob": -1.0, "top": {"a": -1.0}}])).values == {
        "has_logprobs": 1.0
    }


@pytest.mark.parametrize("name", ["coding", "toolcall", "longctx", "verifier", "kld", "greedy"])
def test_safe_score_never_raises(name):
    suite = get_suite(name)
    item = suite.items(n=1)[0]
    weird = [
        Response(),
        Response(content="\x00\ufffd" * 50, finish_reason="length"),
        Response(tool_calls=[call("nope", "null"), call("", '"str"')], finish_reason="tool_calls"),
        Response(logprobs=[{}]),
    ]
    for r in weird:
        s = suite.safe_score(item, r)
        assert s.reason is None or not s.reason.startswith("scorer error"), s.reason
