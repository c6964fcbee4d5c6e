"""The Kimi-K2 chat format: the Jinja CHAT_TEMPLATE (what servers render) and the Python
render_chat (what training and tests render) must produce identical text; the tool-call
parser must accept good markup and degrade malformed markup to content."""

from __future__ import annotations

import json

import pytest
import torch

from qverify.chatfmt import (
    ARG_BEGIN,
    CALL_BEGIN,
    CALL_END,
    SECTION_BEGIN,
    SECTION_END,
    format_tool_calls,
    parse_tool_calls,
    render_chat,
)
from qverify.suites.toolcall_gen import TOOLS

torch.set_num_threads(1)

READ = TOOLS["read_file"][0]
GREP = TOOLS["grep"][0]
BARE_TOOL = {"type": "function", "function": {"name": "ping", "parameters": {"type": "object", "properties": {}}}}


@pytest.fixture(scope="module")
def tokenizer():
    from qverify.reference.data import corpus_for_tokenizer
    from qverify.reference.tokenizer import train_tokenizer

    return train_tokenizer(corpus_for_tokenizer(40))


def _assistant_calls(*calls: tuple[str, object]) -> dict:
    return {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls],
    }


CONVERSATIONS = {
    "user only": ([{"role": "user", "content": "hello"}], None),
    "system and user": ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi there"}], None),
    "tools": ([{"role": "user", "content": "Read src/a.py"}], [READ, GREP]),
    "tool without description or params": ([{"role": "user", "content": "ping"}], [BARE_TOOL]),
    "assistant text": ([{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}], None),
    "tool call round trip": (
        [
            {"role": "user", "content": "Read src/a.py then grep TODO"},
            _assistant_calls(("read_file", '{"path": "src/a.py"}')),
            {"role": "tool", "content": "print('hi')"},
            _assistant_calls(("grep", {"pattern": "TODO <b> & 'x'", "path": "src"}), ("read_file", {"path": "b.py"})),
            {"role": "tool", "content": "src/x.py:3: TODO"},
            {"role": "assistant", "content": "Done, ünïcode ok."},
        ],
        [READ, GREP],
    ),
    "text and call": (
        [
            {"role": "user", "content": "go"},
            {
                "role": "assistant",
                "content": "Sure.",
                "tool_calls": [
                    {"type": "function", "function": {"name": "grep", "arguments": {"pattern": "x", "path": "."}}}
                ],
            },
        ],
        [GREP],
    ),
}


@pytest.mark.parametrize("name", list(CONVERSATIONS))
@pytest.mark.parametrize("gen_prompt", [True, False])
def test_jinja_template_matches_render_chat(tokenizer, name, gen_prompt):
    messages, tools = CONVERSATIONS[name]
    jinja = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen_prompt)
    assert jinja == render_chat(messages, tools, add_generation_prompt=gen_prompt)


def test_render_chat_shape():
    text = render_chat(*CONVERSATIONS["tool call round trip"])
    assert text.startswith(
        "<|im_system|>tools<|im_middle|># Tools\n- read_file(path: string, start_line?: integer): Read a file"
    )
    # call indices continue across assistant turns, as Kimi K2 numbers them
    assert "functions.read_file:0" in text and "functions.grep:1" in text and "functions.read_file:2" in text
    with pytest.raises(ValueError, match="unknown role"):
        render_chat([{"role": "robot", "content": "x"}])


def test_special_tokens_are_single_tokens(tokenizer):
    ids = tokenizer.encode(SECTION_BEGIN + CALL_BEGIN + ARG_BEGIN + CALL_END + SECTION_END, add_special_tokens=False)
    assert len(ids) == 5


# --------------------------------------------------------------------------- parser


def test_parse_round_trip():
    calls = [
        {"name": "read_file", "arguments": {"path": "src/a.py", "start_line": 3}},
        {"name": "grep", "arguments": {"pattern": "{nested: [1, 2]}", "path": "."}},
    ]
    out = parse_tool_calls("Let me look." + format_tool_calls(calls))
    assert not out.malformed and out.content == "Let me look."
    assert [(c["name"], json.loads(c["arguments"])) for c in out.tool_calls] == [
        (c["name"], c["arguments"]) for c in calls
    ]
    assert [c["id"] for c in out.tool_calls] == ["functions.read_file:0", "functions.grep:1"]


def test_parse_plain_text():
    out = parse_tool_calls("no calls here")
    assert out.content == "no calls here" and out.tool_calls == [] and not out.malformed


def test_parse_tolerates_whitespace_and_bare_names():
    text = f'{SECTION_BEGIN}{CALL_BEGIN} lint:0 {ARG_BEGIN}{{"path": "a.py"}}  {CALL_END}{SECTION_END}'
    out = parse_tool_calls(text)
    assert not out.malformed and out.tool_calls == [
        {"id": "functions.lint:0", "name": "lint", "arguments": '{"path": "a.py"}'}
    ]


def test_parse_keeps_bad_json_arguments_raw():
    # the parser splits markup; judging the JSON is the scorer's job (a scored failure)
    text = format_tool_calls([{"name": "lint", "arguments": '{"path": "a.py"'}])
    out = parse_tool_calls(text)
    assert not out.malformed and out.tool_calls[0]["arguments"] == '{"path": "a.py"'


@pytest.mark.parametrize(
    "text",
    [
        f"{SECTION_BEGIN}{CALL_BEGIN}functions.lint:0{ARG_BEGIN}{{}}{CALL_END}",  # section never closed (truncated)
        f"{SECTION_BEGIN}{CALL_BEGIN}functions.lint{ARG_BEGIN}{{}}{CALL_END}{SECTION_END}",  # id without index
        f"{SECTION_BEGIN}{CALL_BEGIN}functions.my tool:0{ARG_BEGIN}{{}}{CALL_END}{SECTION_END}",  # invalid name
        f"{SECTION_BEGIN}just text{SECTION_END}",  # a section with no calls
        f"{SECTION_BEGIN}{CALL_BEGIN}functions.lint:0{ARG_BEGIN}{{}}{SECTION_END}",  # call never closed
    ],
)
def test_parse_malformed_becomes_content(text):
    out = parse_tool_calls(text)
    assert out.malformed and out.tool_calls == [] and out.content == text
