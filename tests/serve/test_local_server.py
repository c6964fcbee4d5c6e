"""The embedded server as a real process on 127.0.0.1, serving a real (memorised) tiny model."""

from __future__ import annotations

import asyncio
import json
import os
import socket

import httpx
import pytest

from qverify.models import ServingProfile
from qverify.serve.local import LocalBackend
from tests import parrot


H: dict[str, str] = {}  # the server's per-launch key, as every request must carry it


@pytest.fixture(scope="module")
def server(parrot_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    # a non-default attention backend, so the flag's way from the profile to the engine is tested (server_info)
    backend = LocalBackend(parrot_dir, None, ServingProfile(flags={"speculative": False, "attention_backend": "flashinfer"}),
                           logs)
    with backend as ep:
        H.update(backend.headers)
        yield backend, ep


def _chat(ep, **body):
    r = httpx.post(headers=H, url=f"{ep.base_url}/chat/completions", json={"model": ep.model, **body}, timeout=120)
    return r


def test_models_and_health(server):
    backend, ep = server
    assert httpx.get(headers=H, url=f"{backend.root_url}/health").json()["status"] == "ok"
    assert httpx.get(headers=H, url=f"{ep.base_url}/models").json()["data"][0]["id"] == ep.model


def test_chat_text(server):
    _, ep = server
    r = _chat(ep, messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=0, max_tokens=30).json()
    ch = r["choices"][0]
    assert ch["message"]["content"] == parrot.TEXT_ANSWER
    assert ch["finish_reason"] == "stop"
    assert r["usage"]["completion_tokens"] > 0 and r["usage"]["total_tokens"] == r["usage"]["prompt_tokens"] + r["usage"]["completion_tokens"]


def test_parsed_tool_call(server):
    _, ep = server
    r = _chat(ep, messages=[{"role": "user", "content": parrot.CALL_PROMPT}], tools=parrot.TOOLS, temperature=0,
              max_tokens=60).json()
    ch = r["choices"][0]
    assert ch["finish_reason"] == "tool_calls"
    call = ch["message"]["tool_calls"][0]
    assert call["id"] == "functions.read_file:0"
    assert call["function"]["name"] == "read_file"
    assert json.loads(call["function"]["arguments"]) == parrot.CALL_ARGS


def test_malformed_markup_is_content_not_500(server):
    _, ep = server
    r = _chat(ep, messages=[{"role": "user", "content": parrot.BAD_PROMPT}], tools=parrot.TOOLS, temperature=0, max_tokens=60)
    assert r.status_code == 200
    ch = r.json()["choices"][0]
    assert ch["finish_reason"] == "stop"
    assert "tool_calls" not in ch["message"]
    assert ch["message"]["content"].startswith("<|tool_calls_section_begin|>")


def test_tool_choice_none_bans_calls(server):
    _, ep = server
    r = _chat(ep, messages=[{"role": "user", "content": parrot.CALL_PROMPT}], tools=parrot.TOOLS, tool_choice="none",
              temperature=0, max_tokens=20).json()
    ch = r["choices"][0]
    assert ch["finish_reason"] != "tool_calls" and "<|tool_calls_section_begin|>" not in (ch["message"]["content"] or "")


def test_finish_length(server):
    _, ep = server
    ch = _chat(ep, messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=0, max_tokens=2).json()["choices"][0]
    assert ch["finish_reason"] == "length"


def test_chat_logprobs(server):
    _, ep = server
    ch = _chat(ep, messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=0, max_tokens=5,
               logprobs=True, top_logprobs=3).json()["choices"][0]
    rows = ch["logprobs"]["content"]
    assert len(rows) == 5
    for row in rows:
        assert len(row["top_logprobs"]) == 3
        assert row["logprob"] <= 0
        # greedy: the chosen token is the most likely one
        assert row["top_logprobs"][0]["token"] == row["token"]


def test_completion_echo_logprobs(server):
    _, ep = server
    r = httpx.post(headers=H, url=f"{ep.base_url}/completions", json={"model": ep.model, "prompt": "def load_config(path):",
                                                      "max_tokens": 0, "echo": True, "logprobs": 4}, timeout=60).json()
    lp = r["choices"][0]["logprobs"]
    assert lp["token_logprobs"][0] is None and len(lp["tokens"]) == r["usage"]["prompt_tokens"]
    assert all(v <= 0 for v in lp["token_logprobs"][1:])
    assert all(len(t) == 4 for t in lp["top_logprobs"][1:])


def test_same_seed_same_output_even_in_a_batch(server):
    _, ep = server
    body = dict(messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=1.5, max_tokens=12, seed=1234)
    alone = _chat(ep, **body).json()["choices"][0]["message"]["content"]

    async def burst():
        async with httpx.AsyncClient(headers=H, timeout=120) as c:
            reqs = [c.post(f"{ep.base_url}/chat/completions", json={"model": ep.model, **body, "seed": 1234 if i == 3 else i})
                    for i in range(8)]
            return [r.json()["choices"][0]["message"]["content"] for r in await asyncio.gather(*reqs)]

    outs = asyncio.run(burst())
    assert outs[3] == alone  # same seed in a batch of 8 → same tokens
    assert len(set(outs)) > 1  # other seeds sample differently at T=1.5


def test_eight_concurrent_requests(server):
    backend, ep = server
    before = httpx.get(headers=H, url=f"{backend.root_url}/server_info").json()

    async def burst():
        async with httpx.AsyncClient(headers=H, timeout=120) as c:
            rs = await asyncio.gather(*[c.post(f"{ep.base_url}/chat/completions", json={
                "model": ep.model, "messages": [{"role": "user", "content": f"{parrot.TEXT_PROMPT} {i}"}],
                "max_tokens": 8, "temperature": 0}) for i in range(8)])
            return [r.status_code for r in rs]

    assert asyncio.run(burst()) == [200] * 8
    after = httpx.get(headers=H, url=f"{backend.root_url}/server_info").json()
    assert after["requests"] - before["requests"] == 8
    assert after["batches"] - before["batches"] < 8  # some requests shared a batch


def test_sixty_four_concurrent_requests_complete_in_shared_steps(server):
    backend, ep = server
    before = httpx.get(headers=H, url=f"{backend.root_url}/server_info").json()

    async def burst():
        async with httpx.AsyncClient(headers=H, timeout=300, limits=httpx.Limits(max_connections=64)) as c:
            rs = await asyncio.gather(*[c.post(f"{ep.base_url}/chat/completions", json={
                "model": ep.model, "messages": [{"role": "user", "content": f"{parrot.TEXT_PROMPT} {i % 5}"}],
                "max_tokens": 12, "temperature": 0.8, "seed": i}) for i in range(64)])
            return [r.status_code for r in rs], [r.json()["usage"]["completion_tokens"] for r in rs]

    codes, tokens = asyncio.run(burst())
    assert codes == [200] * 64 and all(t >= 1 for t in tokens)
    after = httpx.get(headers=H, url=f"{backend.root_url}/server_info").json()
    assert after["requests"] - before["requests"] == 64
    assert after["max_running"] > 8  # decoded together, not 8 at a time as the old batcher did
    assert after["steps"] - before["steps"] < sum(tokens) // 4


def _stream(ep, **body) -> list[dict]:
    chunks = []
    with httpx.stream("POST", headers=H, url=f"{ep.base_url}/chat/completions", json={"model": ep.model, **body, "stream": True},
                      timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        lines = [ln for ln in r.iter_lines() if ln.startswith("data:")]
    assert lines[-1] == "data: [DONE]"
    for ln in lines[:-1]:
        chunks.append(json.loads(ln[5:]))
    return chunks


def test_streamed_text_equals_non_streamed(server):
    _, ep = server
    body = dict(messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=0, max_tokens=30)
    whole = _chat(ep, **body).json()
    chunks = _stream(ep, **body)
    deltas = [c["choices"][0]["delta"].get("content") for c in chunks]
    assert "".join(d or "" for d in deltas) == whole["choices"][0]["message"]["content"] == parrot.TEXT_ANSWER
    assert sum(1 for d in deltas if d) > 1  # really incremental, not one blob at the end
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["usage"]["completion_tokens"] == whole["usage"]["completion_tokens"]


def test_streamed_stop_string_is_never_sent(server):
    _, ep = server
    chunks = _stream(ep, messages=[{"role": "user", "content": parrot.TEXT_PROMPT}], temperature=0, max_tokens=30,
                     stop=[", friend"])
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks) == "hello there"


def test_streamed_tool_call_arrives_as_tool_calls_not_markup(server):
    _, ep = server
    chunks = _stream(ep, messages=[{"role": "user", "content": parrot.CALL_PROMPT}], tools=parrot.TOOLS,
                     temperature=0, max_tokens=60)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert "<|tool_call" not in text
    calls = [tc for c in chunks for tc in c["choices"][0]["delta"].get("tool_calls") or []]
    # OpenAI's shape: the first delta announces id + name before the arguments are done, then the arguments
    assert calls[0]["function"] == {"name": "read_file", "arguments": ""} and calls[0]["id"] == "functions.read_file:0"
    assert len(calls) == 2 and calls[1]["index"] == 0 and "name" not in calls[1]["function"]
    assert json.loads(calls[1]["function"]["arguments"]) == parrot.CALL_ARGS
    assert chunks[-1]["choices"][0]["finish_reason"] == "tool_calls"


def test_context_overflow_is_a_400(server):
    _, ep = server
    r = _chat(ep, messages=[{"role": "user", "content": "word " * 3000}], max_tokens=10)
    assert r.status_code == 400 and "context length" in r.json()["error"]["message"]


def test_clean_shutdown_leaves_no_process(parrot_dir, tmp_path):
    backend = LocalBackend(parrot_dir, None, ServingProfile(), tmp_path)
    with backend:
        pid, port = backend.server.pid, backend.port
        os.kill(pid, 0)  # running
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))  # the port is free again


def test_the_profiles_attention_backend_reaches_the_engine(server):
    """The local profile's attention_backend decides whose FP8-KV numerics the engine emulates (kv_fp8.py)."""
    from qverify.errors import BadInput
    from qverify.serve.profile import load_profile, parse_profile

    backend, _ = server
    assert httpx.get(f"{backend.root_url}/server_info", headers=H).json()["attention_backend"] == "flashinfer"
    assert load_profile("local").flags["attention_backend"] == "trtllm_mla"  # SGLang's B200 default
    with pytest.raises(BadInput, match="emulates trtllm_mla, cutedsl_mla, flashinfer, not 'fa3'"):
        parse_profile("backend: local\nflags: {attention_backend: fa3}")
