"""What part of a partial generation may be streamed: never a stop string, never tool-call markup."""

from qverify.chatfmt import SECTION_BEGIN
from qverify.serve.embedded.streaming import releasable


def test_plain_text_is_released_whole():
    assert releasable("hello there", []) == len("hello there")


def test_a_tail_that_may_start_a_stop_string_is_held_back():
    # "hello, fr" could become "hello, friend": hold back len(stop) - 1 characters
    assert releasable("hello, fr", [", friend"]) == len("hello, fr") - (len(", friend") - 1)


def test_text_stops_at_a_complete_stop_string():
    assert releasable("hello, friend and more text here", [", friend"]) == len("hello")


def test_tool_call_section_is_held():
    text = f"Let me check.{SECTION_BEGIN}<|tool_call_begin|>functions.x:0"
    assert text[: releasable(text, [SECTION_BEGIN])] == "Let me check."


def test_never_negative():
    assert releasable("ab", ["abcdefgh"]) == 0
