"""Server-sent-event streaming for the embedded server's chat endpoint (OpenAI chunk format).

Streaming exists so that time-to-first-token is measured the same way on every backend:
by the client, from the first content-bearing chunk. Tokens arrive from the engine thread
(the engine's per-step on_token callback) through an asyncio queue; text is released only when no stop
string or tool-call section could still start inside it, so the streamed text always equals
the non-streamed answer's content.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from qverify.chatfmt import ARG_BEGIN, CALL_BEGIN
from qverify.serve.embedded.engine import GenResult

# a call's header is complete once its argument marker is out: the name can be announced then,
# as OpenAI and SGLang's parsers do (first delta: id + name; arguments follow)
_HEADER = re.compile(re.escape(CALL_BEGIN) + r"(functions\.([\w.\-]+):\d+)" + re.escape(ARG_BEGIN))

_DONE = object()


class TokenQueue:
    """Thread-safe hand-off of streamed token ids from the engine thread to the event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.q: asyncio.Queue = asyncio.Queue()

    def put(self, ids: list[int]) -> None:  # called on the engine thread
        self.loop.call_soon_threadsafe(self.q.put_nowait, ids)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.q.put_nowait, _DONE)


def releasable(text: str, holds: list[str]) -> int:
    """How much of `text` can be sent: up to the first hold string, minus a tail that might begin one."""
    cut = len(text)
    for h in holds:
        j = text.find(h)
        if j >= 0:
            cut = min(cut, j)
    tail = max((len(h) - 1 for h in holds), default=0)
    return max(0, min(cut, len(text) - tail))


def _chunk(cid: str, model: str, delta: dict[str, Any], finish: str | None = None, **extra: Any) -> str:
    body = {"id": cid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}], **extra}
    return f"data: {json.dumps(body)}\n\n"


async def sse_chat(tokens: TokenQueue, result: asyncio.Future, decode: Callable[[list[int]], str],
                   finish_message: Callable[[GenResult], tuple[dict[str, Any], str]], model: str,
                   holds: list[str], stream_content: bool, usage: Callable[[GenResult], dict[str, Any]],
                   meta: Callable[[GenResult], dict[str, Any]], announce_calls: bool = False,
                   prefill: str = "") -> AsyncIterator[str]:
    """Yield SSE lines: a role chunk, content deltas as tokens arrive, a final chunk, [DONE].

    `finish_message` turns the engine's result into the non-streamed message (content or tool
    calls); whatever of its content was not yet sent goes out before the final chunk. With
    `announce_calls`, a tool call's id and name go out as soon as its header is complete and its
    arguments (parsed and validated as in the non-streamed answer) in the last delta.
    """
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    yield _chunk(cid, model, {"role": "assistant", "content": ""})
    ids: list[int] = []
    progress = _Progress()
    while True:
        item = await tokens.q.get()
        if item is _DONE:
            break
        ids.extend(item)
        if not (stream_content or announce_calls):
            continue  # a named/required tool call: nothing goes out before the end
        for delta in _live_deltas(decode(ids), holds, stream_content, announce_calls, prefill, progress):
            yield _chunk(cid, model, delta)
    try:
        res: GenResult = await result
    except Exception as e:  # noqa: BLE001 - the stream has started (status 200): report in-band, as OpenAI does
        yield f"data: {json.dumps({'error': {'message': f'{type(e).__name__}: {e}', 'type': 'server_error'}})}\n\n"
        yield "data: [DONE]\n\n"
        return
    message, finish = finish_message(res)
    content = message.get("content") or ""
    if stream_content and len(content) > progress.sent:
        yield _chunk(cid, model, {"content": content[progress.sent:]})
    if message.get("tool_calls"):
        yield _chunk(cid, model, {"tool_calls": _final_call_deltas(message["tool_calls"], progress.announced)})
    yield _chunk(cid, model, {}, finish, usage=usage(res), meta_info=meta(res))
    yield "data: [DONE]\n\n"


@dataclass
class _Progress:
    """What of the answer went out while its tokens arrived."""

    sent: int = 0  # characters of content
    announced: list[str] = field(default_factory=list)  # call ids whose name went out early


def _live_deltas(text: str, holds: list[str], stream_content: bool, announce_calls: bool, prefill: str,
                 progress: _Progress) -> list[dict[str, Any]]:
    """The deltas that the answer so far (`text`) lets out beyond `progress`, which they advance."""
    deltas: list[dict[str, Any]] = []
    if stream_content:
        n = releasable(text, holds)
        if n > progress.sent:
            deltas.append({"content": text[progress.sent:n]})
            progress.sent = n
    if announce_calls:
        announced = progress.announced
        for i, m in enumerate(list(_HEADER.finditer(prefill + text))[len(announced):], start=len(announced)):
            announced.append(m.group(1))
            deltas.append({"tool_calls": [{"index": i, "id": m.group(1), "type": "function",
                                           "function": {"name": m.group(2), "arguments": ""}}]})
    return deltas


def _final_call_deltas(calls: list[dict[str, Any]], announced: list[str]) -> list[dict[str, Any]]:
    """The last delta's tool calls: only the arguments of a call whose id and name went out early."""
    deltas = []
    for i, c in enumerate(calls):
        early = i < len(announced) and announced[i] == c["id"]
        deltas.append({"index": i, "function": {"arguments": c["function"]["arguments"]}} if early else {"index": i, **c})
    return deltas
