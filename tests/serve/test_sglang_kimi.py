"""The Kimi production path held against SGLang 0.5.23's own code on CPU: its argument parser on the generated
command lines of a Kimi-shaped build, its kimi_k2 tool-call detector against qverify's parser, and per-choice
meta_info. (SGLang is installed --no-deps in the venv; these parts import without a GPU.)"""

from __future__ import annotations

import json

import pytest

from qverify.chatfmt import ARG_BEGIN, CALL_BEGIN, CALL_END, SECTION_BEGIN, SECTION_END, parse_tool_calls
from qverify.models import BuildManifest
from qverify.serve.profile import load_profile
from tests.serve.test_sglang_cmd import backend, sglang_parser  # noqa: F401  (module fixture)


def _kimi_build(tmp_path, trust: bool, eagle3: bool = True):
    d = tmp_path / "kimi-build"
    (d / "drafter").mkdir(parents=True)
    arch = "LlamaForCausalLMEagle3" if eagle3 else "DeepseekV3ForCausalLM"
    (d / "drafter" / "config.json").write_text(json.dumps({"architectures": [arch]}))
    m = BuildManifest(build_id="fp8kv_nvfp4shared-kimi", recipe="fp8kv_nvfp4shared", recipe_hash="h", recipe_text="",
                      source_model="/models/kimi-k2.6", source_hash="s", kv_dtype="fp8_e4m3", trust_remote_code=trust,
                      drafter_kind="eagle3" if eagle3 else "causal-lm",
                      serving={"kv_cache_dtype": "fp8_e4m3", "weight_quantization": "compressed-tensors"})
    (d / "build.json").write_text(m.model_dump_json())
    return d, m


@pytest.mark.parametrize("profile", ["kimi-k2.6", "kimi-k2.6-thinking", "b200-tp4"])
def test_kimi_build_command_parses_with_trust_remote_code(sglang_parser, tmp_path, profile):  # noqa: F811
    d, m = _kimi_build(tmp_path, trust=True)
    argv = backend(d, m, load_profile(profile), tmp_path, trust_remote_code=True).sglang_args()
    sa = sglang_parser(argv)
    assert sa.trust_remote_code is True  # the build needs it and the user allowed it: the server needs it too
    assert sa.kv_cache_dtype == "fp8_e4m3" and sa.quantization == "compressed-tensors"
    assert sa.speculative_algorithm == "EAGLE3" and sa.tool_call_parser == "kimi_k2"


def test_no_trust_remote_code_unless_the_build_or_profile_asks(sglang_parser, tmp_path):  # noqa: F811
    d, m = _kimi_build(tmp_path, trust=False)
    assert sglang_parser(backend(d, m, load_profile("b200-tp4"), tmp_path).sglang_args()).trust_remote_code is False


def test_sglang_interpreter_is_configurable(tmp_path, monkeypatch):
    d, m = _kimi_build(tmp_path, trust=True)
    monkeypatch.setenv("QVERIFY_SGLANG_PYTHON", "/opt/sglang/bin/python")
    assert backend(d, m, load_profile("kimi-k2.6"), tmp_path, trust_remote_code=True).sglang_args()[0] == "/opt/sglang/bin/python"


def _kimi_text(calls: list[tuple[str, dict]], content: str = "Let me check.") -> str:
    body = "".join(f"{CALL_BEGIN}functions.{n}:{i}{ARG_BEGIN}{json.dumps(a)}{CALL_END}" for i, (n, a) in enumerate(calls))
    return f"{content}{SECTION_BEGIN}{body}{SECTION_END}"


CASES = [
    [("get_weather", {"city": "Paris"})],
    [("read_file", {"path": "/a.py"}), ("grep", {"pattern": "def f", "path": "."})],
    [("run", {"cmd": "ls -la | wc -l", "nested": {"a": [1, 2, {"b": None}]}})],
]


@pytest.mark.parametrize("calls", CASES, ids=["one", "two", "nested"])
def test_qverify_parser_agrees_with_sglang_kimi_k2_detector(calls):
    pytest.importorskip("sglang", reason="install with: pip install --no-deps sglang==0.5.23")
    from sglang.srt.entrypoints.openai.protocol import Function, Tool
    from sglang.srt.function_call.kimik2_detector import KimiK2Detector

    tools = [Tool(type="function", function=Function(name=n, parameters={"type": "object"})) for n, _ in calls]
    text = _kimi_text(calls)
    theirs = KimiK2Detector().detect_and_parse(text, tools)
    ours = parse_tool_calls(text)
    assert ours.content.strip() == (theirs.normal_text or "").strip()
    assert [(c["name"], json.loads(c["arguments"])) for c in ours.tool_calls] == \
        [(c.name, json.loads(c.parameters)) for c in theirs.calls]


def test_plain_text_is_content_for_both():
    pytest.importorskip("sglang")
    from sglang.srt.function_call.kimik2_detector import KimiK2Detector

    assert not KimiK2Detector().has_tool_call("no tools here") and parse_tool_calls("no tools here").tool_calls == []


def test_client_reads_meta_info_per_choice():
    from qverify.evals.client import parse_chat

    data = {"choices": [{"message": {"content": "hi"}, "finish_reason": "stop",
                         "meta_info": {"spec_accept_length": 2.5, "spec_verify_ct": 4}}], "usage": {}}
    assert parse_chat(data).meta_info["spec_accept_length"] == 2.5  # SGLang's place for it


def test_profile_output_budget_and_template_kwargs_reach_the_request():
    from qverify.suites import get_suite

    opts = load_profile("kimi-k2.6").request_options("coding")
    suite = get_suite("coding", **opts)
    body = suite.request(suite.items(n=1)[0])
    assert body["max_tokens"] == 1024 and body["chat_template_kwargs"] == {"thinking": False}
    kld = get_suite("kld", **load_profile("kimi-k2.6").request_options("kld"))
    assert kld.request(kld.items(n=1)[0])["max_tokens"] == 1  # a one-token scorer keeps its budget
