"""Async OpenAI-compatible client with bounded concurrency, timeouts and retries.

httpx rather than the `openai` client: we need fields the SDK hides or drops (SGLang's
`meta_info`, completion echo logprobs) and exact control of what counts as retryable.
An infrastructure failure after retries is an error *class*, never a wrong answer.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any

import httpx

from qverify.models import Endpoint, Response, ToolCall

RETRY_STATUS = {429, 500, 502, 503, 504}


@dataclass
class CallResult:
    response: Response | None
    error: str | None  # infrastructure error class: timeout, connection, http_5xx, http_429, context_overflow, bad_request
    latency_s: float
    attempts: int
    detail: str | None = None


def _classify_400(text: str) -> str:
    t = text.lower()
    return "context_overflow" if ("context length" in t or "maximum context" in t or "too long" in t) else "bad_request"


def _meta_info(choice: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """SGLang returns `meta_info` inside each choice (per request); older servers put it at the top level."""
    return choice.get("meta_info") or data.get("meta_info") or {}


def parse_chat(data: dict[str, Any]) -> Response:
    ch = data["choices"][0]
    msg = ch.get("message") or {}
    calls = [ToolCall(id=c.get("id"), name=c["function"]["name"], arguments=c["function"].get("arguments") or "")
             for c in msg.get("tool_calls") or []]
    lps = None
    if ch.get("logprobs") and ch["logprobs"].get("content"):
        lps = [{"token": x["token"], "logprob": x["logprob"],
                "top": {t["token"]: t["logprob"] for t in x.get("top_logprobs") or []}} for x in ch["logprobs"]["content"]]
    return Response(content=msg.get("content"), tool_calls=calls, finish_reason=ch.get("finish_reason"),
                    usage=data.get("usage") or {}, logprobs=lps, meta_info=_meta_info(ch, data))


def parse_completion(data: dict[str, Any]) -> Response:
    ch = data["choices"][0]
    lp = ch.get("logprobs") or {}
    rows = None
    if lp.get("tokens"):
        rows = [{"token": t, "logprob": v, "top": top or {}}
                for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp.get("top_logprobs") or [None] * len(lp["tokens"]))]
    return Response(content=ch.get("text"), finish_reason=ch.get("finish_reason"), usage=data.get("usage") or {},
                    logprobs=rows, meta_info=_meta_info(ch, data))


class Client:
    def __init__(self, endpoint: Endpoint, concurrency: int = 8, timeout_s: float = 300.0, retries: int = 4,
                 backoff_s: float = 0.5):
        self.endpoint = endpoint
        self.sem = asyncio.Semaphore(concurrency)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.in_flight = 0
        self.max_in_flight = 0
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key and endpoint.api_key != "EMPTY" else {}
        self.http = httpx.AsyncClient(base_url=endpoint.base_url, timeout=timeout_s, headers=headers,
                                      limits=httpx.Limits(max_connections=concurrency * 2))

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, body: dict[str, Any], kind: str = "chat") -> CallResult:
        path = "/chat/completions" if kind == "chat" else "/completions"
        body = {"model": self.endpoint.model, **body}
        async with self.sem:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            try:
                return await self._call(path, body, kind)
            finally:
                self.in_flight -= 1

    async def _call(self, path: str, body: dict[str, Any], kind: str) -> CallResult:
        t0 = time.perf_counter()
        err, detail = "connection", None
        for attempt in range(1, self.retries + 2):
            try:
                r = await self.http.post(path, json=body)
                if r.status_code == 200:
                    data = r.json()
                    resp = parse_chat(data) if kind == "chat" else parse_completion(data)
                    return CallResult(resp, None, time.perf_counter() - t0, attempt)
                detail = r.text[:300]
                if r.status_code not in RETRY_STATUS:
                    err = _classify_400(r.text) if r.status_code == 400 else f"http_{r.status_code}"
                    return CallResult(None, err, time.perf_counter() - t0, attempt, detail)
                err = "http_429" if r.status_code == 429 else "http_5xx"
            except httpx.TimeoutException as e:
                err, detail = "timeout", str(e)[:200]
            except httpx.TransportError as e:
                err, detail = "connection", f"{type(e).__name__}: {e}"[:200]
            except (ValueError, KeyError, IndexError, TypeError) as e:  # a 200 whose body is not a completion
                err, detail = "bad_response", f"{type(e).__name__}: {e}"[:200]
            if attempt <= self.retries:
                await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
        return CallResult(None, err, time.perf_counter() - t0, self.retries + 1, detail)


@dataclass
class StreamTiming:
    """Client-side timings of one streamed chat request (the only backend-neutral way to get TTFT)."""

    ttft_s: float | None  # request sent → first chunk carrying content or a tool call
    total_s: float
    completion_tokens: int | None  # from the final chunk's usage, when the server sends it
    error: str | None = None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens after the first, over the time after the first: decode speed without prefill."""
        if self.ttft_s is None or not self.completion_tokens or self.completion_tokens < 2 or self.total_s <= self.ttft_s:
            return None
        return (self.completion_tokens - 1) / (self.total_s - self.ttft_s)


async def stream_chat(client: Client, body: dict[str, Any]) -> StreamTiming:
    """Send `body` with stream=true and time it; never retried (a retry would distort the timing)."""
    body = {"model": client.endpoint.model, **body, "stream": True,
            "stream_options": {"include_usage": True}}  # OpenAI/SGLang: usage in the last chunk
    t0 = time.perf_counter()
    ttft, tokens = None, None
    try:
        async with client.sem, client.http.stream("POST", "/chat/completions", json=body) as r:
            if r.status_code != 200:
                await r.aread()
                return StreamTiming(None, time.perf_counter() - t0, None, f"http_{r.status_code}")
            async for line in r.aiter_lines():
                if not line.startswith("data:") or line.strip() == "data: [DONE]":
                    continue
                chunk = json.loads(line[5:])
                if "error" in chunk:
                    return StreamTiming(ttft, time.perf_counter() - t0, tokens, "server_error")
                for ch in chunk.get("choices") or []:
                    d = ch.get("delta") or {}
                    if ttft is None and (d.get("content") or d.get("tool_calls") or d.get("reasoning_content")):
                        ttft = time.perf_counter() - t0
                if chunk.get("usage"):
                    tokens = chunk["usage"].get("completion_tokens")
    except httpx.TimeoutException:
        return StreamTiming(ttft, time.perf_counter() - t0, tokens, "timeout")
    except httpx.TransportError:
        return StreamTiming(ttft, time.perf_counter() - t0, tokens, "connection")
    except ValueError:
        return StreamTiming(ttft, time.perf_counter() - t0, tokens, "bad_response")
    return StreamTiming(ttft, time.perf_counter() - t0, tokens)
