"""What the embedded server's generating endpoints share: request bodies, checks, and the run of one request.

A request is checked in full before the engine sees it (400), tokenized off the event loop (a long prompt never
delays /health), and aborted when its client disconnects (its slot is freed, as SGLang does).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

from qverify.serve.embedded.engine import Engine, GenRequest, GenResult
from qverify.serve.embedded.guards import error_body
from qverify.serve.embedded.request import check_request
from qverify.serve.embedded.worker import EngineWorker


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float = 1.0
    top_p: float = 1.0
    stop: str | list[str] | None = None
    seed: int | None = None
    n: int = 1
    stream: bool = False
    return_meta_info: bool = False
    ignore_eos: bool = False  # SGLang's extension: generate exactly max_tokens


class ChatBody(_Body):
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # as SGLang: extra variables for the chat template


class CompletionBody(_Body):
    prompt: str | list[int]
    echo: bool = False
    logprobs: int | None = None


def err(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content=error_body(status, message, kind))


def stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


@dataclass
class Served:
    """One served model: its engine, the worker thread that runs it, and what the endpoints check against."""

    engine: Engine
    worker: EngineWorker
    name: str
    # rendering and tokenizing: one thread, off the event loop (a thread, not a process: the tokenizer is in memory)
    text_pool: ThreadPoolExecutor = field(default_factory=lambda: ThreadPoolExecutor(1, thread_name_prefix="qverify-text"))

    @property
    def tok(self):
        return self.engine.tok

    @property
    def vocab(self) -> int:
        return min(self.engine.vocab, self.engine.n_embeddings)

    async def off_loop(self, fn, *args, **kwargs) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.text_pool, lambda: fn(*args, **kwargs))

    def refused(self, req: GenRequest) -> JSONResponse | None:
        """400 now for a request the engine must never see (check_request), instead of a failure inside a batch."""
        try:
            check_request(req, self.vocab)
        except ValueError as e:
            return err(400, str(e))
        return None

    def too_long(self, n_prompt: int, max_tokens: int) -> JSONResponse | None:
        ctx = self.engine.max_context
        if n_prompt + max_tokens > ctx:
            return err(400, f"This model's maximum context length is {ctx} tokens; the request has "
                            f"{n_prompt} prompt tokens and max_tokens {max_tokens}.")
        return None

    async def generate(self, req: GenRequest, request: Request) -> GenResult:
        """The engine's result; sequence.Aborted (answered 499 by the app) if the client left before it finished."""
        return await self.worker.submit(req, gone=request.is_disconnected)


async def completion(srv: Served, body: CompletionBody, request: Request) -> Any:
    """/v1/completions: text or token ids in; echo with prompt logprobs for scoring."""
    if body.stream:
        return err(400, "stream=true is not supported by the embedded server; use stream=false")
    tok = srv.tok
    ids = body.prompt if isinstance(body.prompt, list) else (await srv.off_loop(tok, body.prompt, add_special_tokens=False))["input_ids"]
    max_tokens = body.max_tokens if body.max_tokens is not None else 16
    if ids and (e := srv.too_long(len(ids), max_tokens)) is not None:
        return e
    k = body.logprobs or 0
    echo = body.echo and body.logprobs is not None
    req = GenRequest(
        prompt_ids=ids, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
        stop=stops(body.stop), want_logprobs=body.logprobs is not None, top_logprobs=k,
        prompt_logprobs=k if echo else None, ignore_eos=body.ignore_eos)
    if (e := srv.refused(req)) is not None:
        return e
    res = await srv.generate(req, request)
    text = (tok.decode(ids, skip_special_tokens=False) if body.echo else "") + res.text
    lp_rows = (res.prompt_logprobs or []) + (res.logprobs or [])
    choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": res.finish_reason}
    if body.logprobs is not None:
        choice["logprobs"] = {"tokens": [x["token"] for x in lp_rows],
                              "token_logprobs": [x["logprob"] for x in lp_rows],
                              "top_logprobs": [x["top"] or None for x in lp_rows]}
    n_out = res.n_generated
    return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
            "model": srv.name, "choices": [choice],
            "usage": {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}}
