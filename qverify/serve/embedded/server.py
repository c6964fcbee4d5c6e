"""The embedded OpenAI-compatible server (FastAPI + uvicorn) for a build on CPU.

    python -m qverify.serve.embedded.server --build DIR [--port N] [--no-quant] [--no-spec] [--max-batch 256]

Endpoints: /health, /v1/models, /v1/chat/completions (stream=true: SSE chunks, for client-side TTFT),
/v1/completions (echo + logprobs),
/server_info (SGLang's field names: max_total_num_tokens, internal_states[0].avg_spec_accept_length).
Generation is qverify.serve.embedded.engine (continuous batching over an MLA latent cache), run by one worker thread.
"""

from __future__ import annotations

import argparse
import asyncio
import hmac
import os
import time
import uuid
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict

from qverify.chatfmt import ARG_BEGIN, CALL_BEGIN, SECTION_BEGIN, parse_tool_calls
from qverify.quantize.kv_scales import DEFAULT_BACKEND, SGLANG_FP8_PATHS
from qverify.serve.embedded.engine import Engine, GenRequest, GenResult
from qverify.serve.embedded.model_loader import LoadedModel, load_for_serving
from qverify.serve.embedded.request import check_request
from qverify.serve.embedded.streaming import TokenQueue, sse_chat
from qverify.serve.embedded.worker import EngineWorker
from qverify.serve.openai_http import KEY_ENV


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


def _err(status: int, message: str, kind: str = "invalid_request_error") -> JSONResponse:
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _stops(stop: str | list[str] | None) -> list[str]:
    return [stop] if isinstance(stop, str) else list(stop or [])


def create_app(loaded: LoadedModel, max_batch: int = 256, threads: int = 1,
               kv_scale_mode: str = "production", attention_backend: str = DEFAULT_BACKEND,
               api_key: str | None = None) -> FastAPI:
    """`api_key`: every request but /health must carry `Authorization: Bearer <key>` (qverify generates one
    per launch, so another local user cannot use, or load, a server it started)."""
    engine = Engine(loaded.model, loaded.tokenizer, loaded.drafter, max_batch=max_batch, fp8_kv=loaded.fp8_kv,
                    scale_mode=kv_scale_mode, sglang_scales=loaded.sglang_kv_scales, attention_backend=attention_backend)
    worker = EngineWorker(engine, threads=threads)
    tok = loaded.tokenizer
    app = FastAPI(title="qverify local server")
    app.state.worker = worker
    name = loaded.served_name
    vocab = min(engine.vocab, engine.n_embeddings)

    if api_key:
        @app.middleware("http")
        async def _auth(request: Request, call_next):
            given = request.headers.get("authorization", "")
            if request.url.path != "/health" and not hmac.compare_digest(given.encode(), f"Bearer {api_key}".encode()):
                return _err(401, "missing or wrong API key", "authentication_error")
            return await call_next(request)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return _err(400, f"{where}: {first.get('msg', 'invalid request')}")

    def refused(req: GenRequest) -> JSONResponse | None:
        """400 now for a request the engine must never see (check_request), instead of a failure inside a batch."""
        try:
            check_request(req, vocab)
        except ValueError as e:
            return _err(400, str(e))
        return None

    def check_len(n_prompt: int, max_tokens: int) -> JSONResponse | None:
        if n_prompt + max_tokens > engine.max_context:
            return _err(400, f"This model's maximum context length is {engine.max_context} tokens; the request has "
                             f"{n_prompt} prompt tokens and max_tokens {max_tokens}.")
        return None

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> Any:
        """SGLang's readiness probe: healthy only if the model can generate a token."""
        res = await worker.submit(GenRequest(prompt_ids=[tok.bos_token_id or 0], max_tokens=1))
        return {"status": "ok", "tokens": len(res.token_ids)}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "qverify",
                                            "max_model_len": engine.max_context}]}

    @app.get("/server_info")
    async def server_info() -> dict:
        return {**loaded.info, "max_total_num_tokens": engine.max_context, "max_batch": engine.max_batch,
                "speculative": engine.drafter is not None, "speculative_algorithm": engine.speculative,
                "kv_fp8_latent": engine.runner.fp8_kv,
                "kv_scale_mode": kv_scale_mode, "attention_backend": attention_backend, "busy_s": round(worker.busy_s, 3), **engine.stats,
                "internal_states": [{"avg_spec_accept_length": engine.avg_accept_length()}]}

    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody) -> Any:
        try:  # tools stay in the prompt even with tool_choice "none"; calls are then banned below
            prompt = tok.apply_chat_template(body.messages, tools=body.tools, tokenize=False, add_generation_prompt=True,
                                             **(body.chat_template_kwargs or {}))
        except Exception as e:  # a malformed message list is the client's error, not a 500
            return _err(400, f"could not render messages: {e}")
        prefill, banned = "", []
        if body.tools and body.tool_choice == "required":
            prefill = SECTION_BEGIN
        elif body.tools and isinstance(body.tool_choice, dict):
            fn = body.tool_choice.get("function", {}).get("name")
            prefill = f"{SECTION_BEGIN}{CALL_BEGIN}functions.{fn}:0{ARG_BEGIN}"
        elif body.tool_choice == "none" or not body.tools:
            banned = [tok.convert_tokens_to_ids(SECTION_BEGIN)]
        ids = tok(prompt + prefill, add_special_tokens=False)["input_ids"]
        max_tokens = body.max_completion_tokens or body.max_tokens or 256
        if max_tokens > 0 and (e := check_len(len(ids), max_tokens)) is not None:
            return e
        parse_tools = bool(body.tools) and body.tool_choice != "none"

        def finish_message(res: GenResult) -> tuple[dict[str, Any], str]:
            parsed = parse_tool_calls(prefill + res.text) if parse_tools else None
            message: dict[str, Any] = {"role": "assistant", "content": res.text}
            if parsed and parsed.tool_calls:
                return {"role": "assistant", "content": parsed.content or None, "tool_calls": [
                    {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
                    for c in parsed.tool_calls]}, "tool_calls"
            if parsed:
                message["content"] = prefill + res.text
            return message, res.finish_reason

        def usage(res: GenResult) -> dict[str, int]:
            return {"prompt_tokens": len(ids), "completion_tokens": res.n_generated,
                    "total_tokens": len(ids) + res.n_generated}

        t0 = time.perf_counter()

        def meta(res: GenResult) -> dict[str, Any]:  # SGLang returns this with return_meta_info; harmless otherwise
            return {**res.meta_info, "e2e_latency": round(time.perf_counter() - t0, 4)}

        req = GenRequest(prompt_ids=ids, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                         seed=body.seed, stop=_stops(body.stop), want_logprobs=body.logprobs,
                         top_logprobs=body.top_logprobs or 0, bad_token_ids=banned, ignore_eos=body.ignore_eos)
        if (e := refused(req)) is not None:
            return e
        if body.stream:
            if body.logprobs:
                return _err(400, "stream=true with logprobs is not supported by the embedded server; use stream=false")
            tokens = TokenQueue()
            req.on_token = tokens.put
            fut = asyncio.ensure_future(worker.submit(req))
            fut.add_done_callback(lambda _: tokens.close())
            special = {tok.eos_token_id, tok.pad_token_id}
            return StreamingResponse(sse_chat(
                tokens, fut, lambda t: tok.decode([i for i in t if i not in special], skip_special_tokens=False),
                finish_message, name, holds=req.stop + ([SECTION_BEGIN] if parse_tools else []),
                stream_content=not prefill, usage=usage, meta=meta, announce_calls=parse_tools, prefill=prefill),
                media_type="text/event-stream")
        res = await worker.submit(req)
        message, finish = finish_message(res)
        # meta_info where SGLang puts it (ChatCompletionResponseChoice.meta_info, entrypoints/openai/protocol.py; what
        # openai_http.spec_meta reads), and at the top level as before
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "meta_info": meta(res)}
        if body.logprobs and res.logprobs is not None:
            choice["logprobs"] = {"content": [
                {"token": x["token"], "logprob": x["logprob"],
                 "top_logprobs": [{"token": t, "logprob": v} for t, v in x["top"].items()]} for x in res.logprobs]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion", "created": int(time.time()),
                "model": name, "choices": [choice], "usage": usage(res), "meta_info": meta(res)}

    @app.post("/v1/completions")
    async def completions(body: CompletionBody) -> Any:
        if body.stream:
            return _err(400, "stream=true is not supported by the embedded server; use stream=false")
        ids = body.prompt if isinstance(body.prompt, list) else tok(body.prompt, add_special_tokens=False)["input_ids"]
        max_tokens = body.max_tokens if body.max_tokens is not None else 16
        if ids and (e := check_len(len(ids), max_tokens)) is not None:
            return e
        k = body.logprobs or 0
        echo = body.echo and body.logprobs is not None
        req = GenRequest(
            prompt_ids=ids, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p, seed=body.seed,
            stop=_stops(body.stop), want_logprobs=body.logprobs is not None, top_logprobs=k,
            prompt_logprobs=k if echo else None, ignore_eos=body.ignore_eos)
        if (e := refused(req)) is not None:
            return e
        res = await worker.submit(req)
        text = (tok.decode(ids, skip_special_tokens=False) if body.echo else "") + res.text
        lp_rows = (res.prompt_logprobs or []) + (res.logprobs or [])
        choice: dict[str, Any] = {"index": 0, "text": text, "finish_reason": res.finish_reason}
        if body.logprobs is not None:
            choice["logprobs"] = {"tokens": [x["token"] for x in lp_rows],
                                  "token_logprobs": [x["logprob"] for x in lp_rows],
                                  "top_logprobs": [x["top"] or None for x in lp_rows]}
        n_out = res.n_generated
        return {"id": f"cmpl-{uuid.uuid4().hex[:12]}", "object": "text_completion", "created": int(time.time()),
                "model": name, "choices": [choice],
                "usage": {"prompt_tokens": len(ids), "completion_tokens": n_out, "total_tokens": len(ids) + n_out}}

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return _err(500, f"{type(exc).__name__}: {exc}", "server_error")

    return app


def _die_with_parent() -> None:
    """Exit when the process that launched us is gone (even if it was SIGKILLed).

    The server runs in its own session so `stop()` can end its whole group; the price is
    that a killed client would leave it orphaned, so it watches its launcher instead.
    """
    import os
    import threading

    parent = int(os.environ.get("QVERIFY_PARENT_PID", "0"))
    if not parent:
        return

    def watch() -> None:
        while True:
            try:
                os.kill(parent, 0)
            except ProcessLookupError:
                os._exit(0)
            time.sleep(1.0)

    threading.Thread(target=watch, daemon=True, name="die-with-parent").start()


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="qverify embedded OpenAI-compatible server")
    ap.add_argument("--build", type=Path, required=True, help="build dir (with build.json) or a HF model dir")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-batch", type=int, default=256, help="most sequences decoding at once")
    ap.add_argument("--kv-scale-mode", choices=["production", "compressed-tensors"], default="production",
                    help="FP8 latent KV: as SGLang computes it (default) or with compressed-tensors' k/v pair")
    ap.add_argument("--attention-backend", choices=sorted(SGLANG_FP8_PATHS), default=DEFAULT_BACKEND,
                    help="whose FP8-KV numerics to emulate (SGLang's MLA backend; docs/serve.md)")
    ap.add_argument("--trust-remote-code", action="store_true", help="allow the build's own code (when it needs it)")
    ap.add_argument("--no-quant", action="store_true", help="switch fake quantization off (logits = baseline)")
    spec = ap.add_mutually_exclusive_group()
    spec.add_argument("--spec", dest="spec", action="store_true", default=None, help="use the build's drafter")
    spec.add_argument("--no-spec", dest="spec", action="store_false", help="ignore the build's drafter")
    ap.add_argument("--dtype", default="float32", help="compute dtype on CPU (float32 is faster than bf16 here)")
    args = ap.parse_args(argv)
    import torch
    import uvicorn

    torch.set_num_threads(args.threads)
    _die_with_parent()
    loaded = load_for_serving(args.build, quantization=not args.no_quant, speculative=args.spec, dtype=args.dtype,
                              trust_remote_code=args.trust_remote_code)
    app = create_app(loaded, max_batch=args.max_batch, threads=args.threads, kv_scale_mode=args.kv_scale_mode,
                     attention_backend=args.attention_backend, api_key=os.environ.pop(KEY_ENV, None))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
