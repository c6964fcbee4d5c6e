"""/v1/chat/completions on the embedded server: render, check, generate, answer (JSON or SSE).

The chat template is the model's own: a request's `chat_template_kwargs` may set the template's variables but
not the template, as SGLang refuses a request-supplied `chat_template` unless started with
--trust-request-chat-template (a client's Jinja would run inside the server). Rendering and tokenizing run off
the event loop (generation.Served.off_loop).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from fastapi import Request
from fastapi.responses import StreamingResponse

from qverify.chatfmt import ARG_BEGIN, CALL_BEGIN, SECTION_BEGIN, parse_tool_calls
from qverify.serve.embedded.engine import GenRequest, GenResult
from qverify.serve.embedded.generation import ChatBody, Served, err, stops
from qverify.serve.embedded.streaming import TokenQueue, sse_chat

# apply_chat_template's own arguments: set through chat_template_kwargs they would replace the template (SGLang's
# refusal) or change what rendering returns
_NOT_TEMPLATE_VARIABLES = ("chat_template", "tokenize", "tools", "add_generation_prompt", "return_dict", "tokenizer_kwargs")


@dataclass
class Rendered:
    ids: list[int]
    prefill: str  # what the answer starts with (a forced tool call's header)
    banned: list[int]
    parse_tools: bool


def template_refusal(body: ChatBody) -> str | None:
    bad = [k for k in (body.chat_template_kwargs or {}) if k in _NOT_TEMPLATE_VARIABLES]
    if "chat_template" in bad:
        return ("Request-supplied chat_template is not allowed (as SGLang without --trust-request-chat-template): "
                "the server renders with the model's own template")
    return f"chat_template_kwargs may not set {bad[0]!r}" if bad else None


def render(tok, body: ChatBody) -> Rendered:
    """The prompt's token ids, with a forced tool call's header prefilled; ValueError: the messages do not render."""
    try:  # tools stay in the prompt even with tool_choice "none"; calls are then banned below
        prompt = tok.apply_chat_template(body.messages, tools=body.tools, tokenize=False, add_generation_prompt=True,
                                         **(body.chat_template_kwargs or {}))
    except Exception as e:  # noqa: BLE001 - a malformed message list is the client's error, not a 500
        raise ValueError(f"could not render messages: {e}") from None
    prefill, banned = "", []
    if body.tools and body.tool_choice == "required":
        prefill = SECTION_BEGIN
    elif body.tools and isinstance(body.tool_choice, dict):
        fn = body.tool_choice.get("function")
        fn = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(fn, str):  # was an AttributeError, a 500 with a traceback in the log each time
            raise ValueError('tool_choice must be {"type": "function", "function": {"name": "..."}}')
        prefill = f"{SECTION_BEGIN}{CALL_BEGIN}functions.{fn}:0{ARG_BEGIN}"
    elif body.tool_choice == "none" or not body.tools:
        banned = [tok.convert_tokens_to_ids(SECTION_BEGIN)]
    ids = tok(prompt + prefill, add_special_tokens=False)["input_ids"]
    return Rendered(ids, prefill, banned, bool(body.tools) and body.tool_choice != "none")


def finish_message(r: Rendered, res: GenResult) -> tuple[dict[str, Any], str]:
    parsed = parse_tool_calls(r.prefill + res.text) if r.parse_tools else None
    message: dict[str, Any] = {"role": "assistant", "content": res.text}
    if parsed and parsed.tool_calls:
        return {"role": "assistant", "content": parsed.content or None, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in parsed.tool_calls]}, "tool_calls"
    if parsed:
        message["content"] = r.prefill + res.text
    return message, res.finish_reason


async def chat_completion(srv: Served, body: ChatBody, request: Request) -> Any:
    if (why := template_refusal(body)) is not None:
        return err(400, why)
    try:
        r: Rendered = await srv.off_loop(render, srv.tok, body)
    except ValueError as e:
        return err(400, str(e))
    max_tokens = body.max_completion_tokens or body.max_tokens or 256
    if max_tokens > 0 and (e := srv.too_long(len(r.ids), max_tokens)) is not None:
        return e
    req = GenRequest(prompt_ids=r.ids, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                     seed=body.seed, stop=stops(body.stop), want_logprobs=body.logprobs,
                     top_logprobs=body.top_logprobs or 0, bad_token_ids=r.banned, ignore_eos=body.ignore_eos)
    if (e := srv.refused(req)) is not None:
        return e
    t0 = time.perf_counter()
    usage = lambda res: {"prompt_tokens": len(r.ids), "completion_tokens": res.n_generated,
                         "total_tokens": len(r.ids) + res.n_generated}
    # SGLang returns this with return_meta_info; harmless otherwise
    meta = lambda res: {**res.meta_info, "e2e_latency": round(time.perf_counter() - t0, 4)}
    if body.stream:
        if body.logprobs:
            return err(400, "stream=true with logprobs is not supported by the embedded server; use stream=false")
        return _stream(srv, req, r, usage, meta)
    res = await srv.generate(req, request)
    message, finish = finish_message(r, res)
    # meta_info where SGLang puts it (ChatCompletionResponseChoice.meta_info, entrypoints/openai/protocol.py; what
    # openai_http.spec_meta reads), and at the top level as before
    choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "meta_info": meta(res)}
    if body.logprobs and res.logprobs is not None:
        choice["logprobs"] = {"content": [
            {"token": x["token"], "logprob": x["logprob"],
             "top_logprobs": [{"token": t, "logprob": v} for t, v in x["top"].items()]} for x in res.logprobs]}
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
            "model": srv.name, "choices": [choice], "usage": usage(res), "meta_info": meta(res)}


def _stream(srv: Served, req: GenRequest, r: Rendered, usage, meta) -> StreamingResponse:
    tok = srv.tok
    tokens = TokenQueue()
    req.on_token = tokens.put
    fut = srv.worker.start(req)
    fut.add_done_callback(lambda f: (tokens.close(), f.cancelled() or f.exception()))  # read: an aborted one is no news
    special = {tok.eos_token_id, tok.pad_token_id}
    lines = sse_chat(tokens, fut, lambda t: tok.decode([i for i in t if i not in special], skip_special_tokens=False),
                     lambda res: finish_message(r, res), srv.name,
                     holds=req.stop + ([SECTION_BEGIN] if r.parse_tools else []), stream_content=not r.prefill,
                     usage=usage, meta=meta, announce_calls=r.parse_tools, prefill=r.prefill)

    async def until_done_or_gone():
        """Starlette cancels the stream when its client disconnects: the sequence is aborted then, as SGLang does."""
        try:
            async for line in lines:
                yield line
        finally:
            if not fut.done():
                srv.worker.abort(req)

    return StreamingResponse(until_done_or_gone(), media_type="text/event-stream")

