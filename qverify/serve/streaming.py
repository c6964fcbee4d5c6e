"""Server-sent-event streaming for the embedded server's chat endpoint (OpenAI chunk format).

Streaming exists so that time-to-first-token is measured the same way on every backend:
by the client, from the first content-bearing chunk. Tokens arrive from the engine thread
(transformers' streamer hook) through an asyncio queue; text is released only when no stop
string or tool-call section could still start inside it, so the streamed text always equals
the non-streamed answer's content.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from qverify.serve.engine import GenResult

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
                   meta: Callable[[GenResult], dict[str, Any]]) -> AsyncIterator[str]:
    """Yield SSE lines: a role chunk, content deltas as tokens arrive, a final chunk, [DONE].

    `finish_message` turns the engine's result into the non-streamed message (content or tool
    calls); whatever of its content was not yet sent goes out before the final chunk.
    """
    cid = f"chatcmpl-{uuid.uuid4().hex[:12]}"
    yield _chunk(cid, model, {"role": "assistant", "content": ""})
    ids: list[int] = []
    sent = 0
    while True:
        item = await tokens.q.get()
        if item is _DONE:
            break
        ids.extend(item)
        if stream_content:
            text = decode(ids)
            n = releasable(text, holds)
            if n > sent:
                yield _chunk(cid, model, {"content": text[sent:n]})
                sent = n
    try:
        res: GenResult = await result
    except Exception as e:  # the stream has started (status 200): report in-band, as OpenAI does
        yield f"data: {json.dumps({'error': {'message': f'{type(e).__name__}: {e}', 'type': 'server_error'}})}\n\n"
        yield "data: [DONE]\n\n"
        return
    message, finish = finish_message(res)
    content = message.get("content") or ""
    if stream_content and len(content) > sent:
        yield _chunk(cid, model, {"content": content[sent:]})
    if message.get("tool_calls"):
        yield _chunk(cid, model, {"tool_calls": [{"index": i, **c} for i, c in enumerate(message["tool_calls"])]})
    yield _chunk(cid, model, {}, finish, usage=usage(res), meta_info=meta(res))
    yield "data: [DONE]\n\n"
