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

from qverify.evals.body import (
    ACCEPT_ENCODING,
    IN_FLIGHT,
    MAX_BODY_BYTES,
    MAX_ERROR_BODY_BYTES,
    BodyTooLarge,
    capped_lines,
    read_capped,
    retry_after_s,
)
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


class MalformedResponse(ValueError):
    """A 200 whose body is not a completion: recorded per item as `bad_response`, never scored."""


def _choice(data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise MalformedResponse(f"the body is a JSON {type(data).__name__}, not an object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"no choices (got {json.dumps(choices)[:60]})")
    if not isinstance(choices[0], dict):
        raise MalformedResponse(f"choices[0] is {json.dumps(choices[0])[:60]}, not an object")
    return choices[0]


def _usage(data: dict[str, Any]) -> dict[str, int]:
    """Token counts only: servers add nested details (or nulls) that no metric reads."""
    u = data.get("usage")
    return {k: v for k, v in u.items() if isinstance(v, int) and not isinstance(v, bool)} if isinstance(u, dict) else {}


def _meta(ch: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    # SGLang returns meta_info inside each choice; older servers (and ours) at the top level
    meta = ch.get("meta_info") or data.get("meta_info")
    return meta if isinstance(meta, dict) else {}


def _model(data: dict[str, Any]) -> str | None:
    # the name the server answered as: recorded so the gate can refuse a run served by another model
    m = data.get("model")
    return m[:200] if isinstance(m, str) else None


def parse_chat(data: Any) -> Response:
    ch = _choice(data)
    msg = ch.get("message") or {}
    if not isinstance(msg, dict):
        raise MalformedResponse(f"choices[0].message is {json.dumps(msg)[:60]}, not an object")
    calls = [ToolCall(id=c.get("id"), name=c["function"]["name"], arguments=c["function"].get("arguments") or "")
             for c in msg.get("tool_calls") or []]
    lps = None
    if ch.get("logprobs") and ch["logprobs"].get("content"):
        lps = [{"token": x["token"], "logprob": x["logprob"],
                "top": {t["token"]: t["logprob"] for t in x.get("top_logprobs") or []}} for x in ch["logprobs"]["content"]]
    return Response(content=msg.get("content"), tool_calls=calls, finish_reason=ch.get("finish_reason"),
                    usage=_usage(data), logprobs=lps, meta_info=_meta(ch, data), model=_model(data))


def parse_completion(data: Any) -> Response:
    ch = _choice(data)
    lp = ch.get("logprobs") or {}
    rows = None
    if lp.get("tokens"):
        rows = [{"token": t, "logprob": v, "top": top or {}}
                for t, v, top in zip(lp["tokens"], lp["token_logprobs"], lp.get("top_logprobs") or [None] * len(lp["tokens"]))]
    return Response(content=ch.get("text"), finish_reason=ch.get("finish_reason"), usage=_usage(data),
                    logprobs=rows, meta_info=_meta(ch, data), model=_model(data))


def _parsed(raw: bytes, kind: str) -> tuple[Response | None, str | None]:
    """(the response, None), or (None, why) for a 200 whose body is not a completion (this item's bad_response)."""
    try:
        data = json.loads(raw)
        return (parse_chat(data) if kind == "chat" else parse_completion(data)), None
    except Exception as e:  # noqa: BLE001 - any body that is not a completion is this item's error
        return None, f"{type(e).__name__}: {e}"[:200]


@dataclass(frozen=True)
class Timeouts:
    """Client timeouts in seconds: to connect, between bytes, and for one item in total (retries included)."""

    connect_s: float
    read_s: float
    item_s: float

    def httpx(self) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_s, read=self.read_s, write=self.read_s, pool=self.item_s)


# The embedded CPU server runs a tiny model: a whole answer takes seconds even queued behind a batch, so a
# minute of silence means it is stuck. A large real model answers a non-streamed request only when it is done:
# a 32k-token thinking answer at ~30 tok/s under load arrives after ~18 minutes.
# requests in flight when neither --concurrency nor qverify.toml sets it. local: the embedded engine decodes every
# request it holds in one batch (up to its max_batch, 256), and a step's fixed costs (~120 small ops per layer)
# are shared by the whole batch: at 256 it runs 1.2x the tokens per CPU-second it runs at 64
# (benchmarks/engine_throughput.py --limit 200). sglang / endpoint: unchanged; a remote server's rate limits
# and its own scheduler decide there.
DEFAULT_CONCURRENCY = {"local": 256, "sglang": 64, "endpoint": 64}

DEFAULT_TIMEOUTS = {"local": Timeouts(5.0, 120.0, 600.0),
                    "sglang": Timeouts(10.0, 1800.0, 3600.0),
                    "endpoint": Timeouts(10.0, 1800.0, 3600.0)}


def timeouts_for(backend: str, connect_s: float | None = None, read_s: float | None = None,
                 item_s: float | None = None) -> Timeouts:
    """The backend's defaults with any of the three overridden (CLI flag or qverify.toml [client])."""
    d = DEFAULT_TIMEOUTS.get(backend, DEFAULT_TIMEOUTS["endpoint"])
    return Timeouts(connect_s or d.connect_s, read_s or d.read_s, item_s or d.item_s)


@dataclass(frozen=True)
class _Attempt:
    """What one POST came back with: an answer, or an error class and how a retry may follow it."""

    err: str | None = None
    detail: str | None = None
    response: Response | None = None
    final: bool = False  # an error no retry fixes (a 4xx): returned at once
    bad_body: bool = False  # a body that is not a completion: retried once, after the plain backoff
    wait: float | None = None  # the server's Retry-After, when it sent one


class Client:
    # retries 4 and backoff 0.5 s, doubling with jitter: about 7.5 s of waiting in all (0.5 + 1 + 2 + 4), enough to
    # ride out a restarting proxy or a brief 503/429 and far inside every backend's item timeout (DEFAULT_TIMEOUTS).
    # A choice, not a measurement; a server that stays down is caught by run_plan's liveness check instead.
    def __init__(self, endpoint: Endpoint, concurrency: int = 8, timeouts: Timeouts | None = None, retries: int = 4,
                 backoff_s: float = 0.5):
        if concurrency < 1:  # a semaphore of 0 would wait forever
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        self.endpoint = endpoint
        self.sem = asyncio.Semaphore(concurrency)
        self.timeouts = timeouts or DEFAULT_TIMEOUTS["local"]
        self.retries = retries
        self.backoff_s = backoff_s
        self.in_flight = 0
        self.max_in_flight = 0
        headers = {"Authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key and endpoint.api_key != "EMPTY" else {}
        headers["Accept-Encoding"] = ACCEPT_ENCODING  # the encodings evals/body.py decodes under its cap
        self.http = httpx.AsyncClient(base_url=endpoint.base_url, timeout=self.timeouts.httpx(), headers=headers,
                                      limits=httpx.Limits(max_connections=concurrency * 2))

    async def close(self) -> None:
        await self.http.aclose()

    async def call(self, body: dict[str, Any], kind: str = "chat") -> CallResult:
        path = "/chat/completions" if kind == "chat" else "/completions"
        body = {"model": self.endpoint.model, **body}
        async with self.sem:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            t0 = time.perf_counter()
            tries = [0]
            try:
                return await asyncio.wait_for(self._call(path, body, kind, tries), self.timeouts.item_s)
            except TimeoutError:
                return CallResult(None, "timeout", time.perf_counter() - t0, tries[0],
                                  f"no answer within the item timeout ({self.timeouts.item_s:g}s, retries included)")
            finally:
                self.in_flight -= 1

    async def _call(self, path: str, body: dict[str, Any], kind: str, tries: list[int]) -> CallResult:
        t0 = time.perf_counter()
        deadline = t0 + self.timeouts.item_s
        err, detail = "connection", None
        for attempt in range(1, self.retries + 2):
            tries[0] = attempt
            outcome = await self._attempt(path, body, kind)
            if outcome.response is not None:
                return CallResult(outcome.response, None, time.perf_counter() - t0, attempt)
            err, detail = outcome.err, outcome.detail
            if outcome.final:
                return CallResult(None, err, time.perf_counter() - t0, attempt, detail)
            if outcome.bad_body:
                if attempt >= 2:  # once more in case a proxy cut it short; a broken server stays broken
                    break
                await asyncio.sleep(self.backoff_s)
                continue
            if attempt <= self.retries:
                if outcome.wait is not None:
                    # the server said when to come back (429/503 Retry-After): honour it, unless that is past
                    # this item's time budget, where waiting only turns a clear http_429 into a timeout
                    if time.perf_counter() + outcome.wait > deadline:
                        detail = (f"Retry-After {outcome.wait:g}s is past the item timeout "
                                  f"({self.timeouts.item_s:g}s): {detail}")[:300]
                        break
                    await asyncio.sleep(outcome.wait)
                else:
                    await asyncio.sleep(self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random()))
        return CallResult(None, err, time.perf_counter() - t0, tries[0], detail)

    async def _attempt(self, path: str, body: dict[str, Any], kind: str) -> _Attempt:
        """One POST: its answer, or its error class and whether (and when) a retry may help."""
        try:
            with IN_FLIGHT.share() as held:  # the raw body counts in the process-wide budget until it is parsed
                async with self.http.stream("POST", path, json=body) as r:
                    ok = r.status_code == 200
                    raw = await read_capped(r, MAX_BODY_BYTES if ok else MAX_ERROR_BODY_BYTES, strict=ok, held=held)
                if ok:
                    resp, bad = _parsed(raw, kind)
                    raw = b""  # nothing of an answer stays held past its share
            if ok:
                return _Attempt(response=resp) if bad is None else _Attempt("bad_response", bad, bad_body=True)
            text = raw.decode("utf-8", "replace")
            if r.status_code not in RETRY_STATUS:
                err = _classify_400(text) if r.status_code == 400 else f"http_{r.status_code}"
                return _Attempt(err, text[:300], final=True)
            return _Attempt("http_429" if r.status_code == 429 else "http_5xx", text[:300], wait=retry_after_s(r))
        except (httpx.DecodingError, BodyTooLarge) as e:
            # a body that does not decode (gzip on plain bytes) or is too big: this item's answer is bad,
            # never a crash of the whole eval; retried once like any bad body
            return _Attempt("bad_response", f"{type(e).__name__}: {e}"[:200], bad_body=True)
        except httpx.TimeoutException as e:
            return _Attempt("timeout", str(e)[:200])
        except httpx.TransportError as e:
            return _Attempt("connection", f"{type(e).__name__}: {e}"[:200])


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
    """Send `body` with stream=true and time it; never retried (a retry would distort the timing).

    Bounded by the client's item timeout; a chunk that is not a JSON object is `bad_response`.
    """
    body = {"model": client.endpoint.model, **body, "stream": True,
            "stream_options": {"include_usage": True}}  # OpenAI/SGLang: usage in the last chunk
    t0 = time.perf_counter()
    seen: dict[str, Any] = {"ttft": None, "tokens": None}
    try:
        async with client.sem:
            err = await asyncio.wait_for(_stream(client, body, t0, seen), client.timeouts.item_s)
    except (TimeoutError, httpx.TimeoutException):
        err = "timeout"
    except httpx.TransportError:
        err = "connection"
    except (ValueError, AttributeError, TypeError, httpx.DecodingError):  # not JSON, not UTF-8, wrong shape, over the cap
        err = "bad_response"
    return StreamTiming(seen["ttft"], time.perf_counter() - t0, seen["tokens"], err)


async def _stream(client: Client, body: dict[str, Any], t0: float, seen: dict[str, Any]) -> str | None:
    async with client.http.stream("POST", "/chat/completions", json=body) as r:
        if r.status_code != 200:
            await read_capped(r, MAX_ERROR_BODY_BYTES, strict=False)
            return f"http_{r.status_code}"
        async for line in capped_lines(r):
            if not line.startswith("data:") or line.strip() == "data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if not isinstance(chunk, dict):
                return "bad_response"
            if "error" in chunk:
                return "server_error"
            for ch in chunk.get("choices") or []:
                d = ch.get("delta") or {}
                if seen["ttft"] is None and (d.get("content") or d.get("tool_calls") or d.get("reasoning_content")):
                    seen["ttft"] = time.perf_counter() - t0
            tokens = chunk["usage"].get("completion_tokens") if isinstance(chunk.get("usage"), dict) else None
            if isinstance(tokens, int):
                seen["tokens"] = tokens
    return None
