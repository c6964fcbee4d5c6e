"""The Kimi-K2 chat and tool-call format, shared by the tokenizer's chat template,
the local server's tool-call parser, and training-data rendering.

Tool calls look exactly as Kimi K2 emits them, so SGLang's `--tool-call-parser kimi_k2`
and qverify's local server parse the same text:

    <|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}<|tool_call_end|><|tool_calls_section_end|>

Tools are rendered compactly (`- name(arg: type, opt?: type): description`), because a
full JSON schema per tool spent ~290 of ~300 prompt tokens in an earlier probe.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
CALL_BEGIN = "<|tool_call_begin|>"
ARG_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"
IM_END = "<|im_end|>"
ROLE_TOKENS = ["<|im_system|>", "<|im_user|>", "<|im_assistant|>", "<|im_tool|>", "<|im_middle|>"]
SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", IM_END, *ROLE_TOKENS, SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END]
MARKUP = [SECTION_BEGIN, SECTION_END, CALL_BEGIN, ARG_BEGIN, CALL_END]

# Jinja chat template stored in tokenizer_config.json. Mirrors `render_chat` below; a test
# checks both produce the same text. Newlines are emitted as `{{ '\\n' }}` expressions because
# Jinja's `-%}` / `{%-` whitespace control strips literal newlines next to tags.
CHAT_TEMPLATE = (
    "{%- set ns = namespace(idx=0) -%}"
    "{%- if tools -%}"
    "<|im_system|>tools<|im_middle|># Tools"
    "{%- for t in tools -%}{%- set f = t.function if t.function is defined else t -%}"
    "{%- set req = f.parameters.required if f.parameters.required is defined else [] -%}"
    "{{ '\\n- ' }}{{ f.name }}("
    "{%- for pname, p in f.parameters.properties.items() -%}"
    "{{ pname }}{% if pname not in req %}?{% endif %}: {{ p.type }}{% if not loop.last %}, {% endif %}"
    "{%- endfor -%}): {{ f.description }}"
    "{%- endfor -%}<|im_end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'system' -%}<|im_system|>system<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'user' -%}<|im_user|>user<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'tool' -%}<|im_tool|>tool<|im_middle|>{{ m.content }}<|im_end|>"
    "{%- elif m.role == 'assistant' -%}<|im_assistant|>assistant<|im_middle|>"
    "{%- if m.content %}{{ m.content }}{% endif -%}"
    "{%- if m.tool_calls -%}<|tool_calls_section_begin|>"
    "{%- for c in m.tool_calls -%}"
    "<|tool_call_begin|>functions.{{ c.function.name }}:{{ ns.idx }}<|tool_call_argument_begin|>"
    "{%- if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif -%}"
    "<|tool_call_end|>{%- set ns.idx = ns.idx + 1 -%}"
    "{%- endfor -%}<|tool_calls_section_end|>"
    "{%- endif -%}<|im_end|>"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>{%- endif -%}"
)

GENERATION_PROMPT = "<|im_assistant|>assistant<|im_middle|>"


def _fn(tool: dict) -> dict:
    return tool.get("function", tool)


def render_tools(tools: list[dict]) -> str:
    lines = ["# Tools"]
    for t in tools:
        f = _fn(t)
        params = f.get("parameters", {})
        req = params.get("required", [])
        args = ", ".join(
            f"{name}{'' if name in req else '?'}: {p.get('type')}" for name, p in params.get("properties", {}).items()
        )
        lines.append(f"- {f['name']}({args}): {f.get('description', '')}")
    return "\n".join(lines)


def format_tool_calls(calls: list[dict], start_idx: int = 0) -> str:
    """calls: [{"name": str, "arguments": dict|str}] -> Kimi-K2 markup."""
    parts = [SECTION_BEGIN]
    for i, c in enumerate(calls):
        args = c["arguments"] if isinstance(c["arguments"], str) else json.dumps(c["arguments"], ensure_ascii=False)
        parts.append(f"{CALL_BEGIN}functions.{c['name']}:{start_idx + i}{ARG_BEGIN}{args}{CALL_END}")
    parts.append(SECTION_END)
    return "".join(parts)


def render_chat(messages: list[dict], tools: list[dict] | None = None, add_generation_prompt: bool = True) -> str:
    """Python twin of CHAT_TEMPLATE (used where no tokenizer is at hand, e.g. tests and training)."""
    out = []
    if tools:
        out.append(f"<|im_system|>tools<|im_middle|>{render_tools(tools)}{IM_END}")
    idx = 0
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "assistant":
            body = content
            if m.get("tool_calls"):
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]
                body += format_tool_calls(calls, idx)
                idx += len(calls)
            out.append(f"<|im_assistant|>assistant<|im_middle|>{body}{IM_END}")
        elif role in ("system", "user", "tool"):
            out.append(f"<|im_{role}|>{role}<|im_middle|>{content}{IM_END}")
        else:
            raise ValueError(f"unknown role {role!r}")
    if add_generation_prompt:
        out.append(GENERATION_PROMPT)
    return "".join(out)


@dataclass
class ParsedOutput:
    content: str
    tool_calls: list[dict]  # [{"id": "functions.NAME:IDX", "name": str, "arguments": str}]
    malformed: bool = False


_CALL_RE = re.compile(
    re.escape(CALL_BEGIN) + r"\s*(?P<id>[^<]*?)\s*" + re.escape(ARG_BEGIN) + r"(?P<args>.*?)\s*" + re.escape(CALL_END),
    re.DOTALL,
)
_ID_RE = re.compile(r"^(?:functions\.)?(?P<name>[A-Za-z_][\w\-\.]*):(?P<idx>\d+)$")


def parse_tool_calls(text: str) -> ParsedOutput:
    """Split generated text into content and tool calls.

    Malformed markup (unclosed section, bad id) is returned as plain content with
    `malformed=True`, never raised: a real server answers such output as content.
    """
    if SECTION_BEGIN not in text:
        return ParsedOutput(content=text, tool_calls=[])
    head, _, rest = text.partition(SECTION_BEGIN)
    if SECTION_END not in rest:
        return ParsedOutput(content=text, tool_calls=[], malformed=True)
    section, _, _tail = rest.partition(SECTION_END)
    calls = []
    for m in _CALL_RE.finditer(section):
        idm = _ID_RE.match(m.group("id").strip())
        if not idm:
            return ParsedOutput(content=text, tool_calls=[], malformed=True)
        calls.append({"id": f"functions.{idm['name']}:{idm['idx']}", "name": idm["name"], "arguments": m.group("args")})
    if not calls:
        return ParsedOutput(content=text, tool_calls=[], malformed=True)
    return ParsedOutput(content=head, tool_calls=calls)
