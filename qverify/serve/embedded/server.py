"""The embedded OpenAI-compatible server (FastAPI + uvicorn) for a build on CPU.

    python -m qverify.serve.embedded.server --build DIR [--port N] [--no-quant] [--no-spec] [--max-batch 256]

Endpoints: /health, /v1/models, /v1/chat/completions (stream=true: SSE chunks, for client-side TTFT),
/v1/completions (echo + logprobs),
/server_info (SGLang's field names: max_total_num_tokens, internal_states[0].avg_spec_accept_length).
Generation is qverify.serve.embedded.engine (continuous batching over an MLA latent cache), run by one worker thread.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from qverify.quantize.kv_scales import DEFAULT_BACKEND, SGLANG_FP8_PATHS
from qverify.serve.embedded.chat import chat_completion
from qverify.serve.embedded.engine import Engine, GenRequest
from qverify.serve.embedded.generation import ChatBody, CompletionBody, Served, completion, err
from qverify.serve.embedded.guards import BYTES_PER_CONTEXT_TOKEN, KeyGuard, body_limit, one_traceback_per_kind
from qverify.serve.embedded.model_loader import LoadedModel, load_for_serving
from qverify.serve.embedded.sequence import Aborted
from qverify.serve.embedded.worker import EngineWorker
from qverify.serve.openai_http import KEY_ENV


def create_app(loaded: LoadedModel, max_batch: int = 256, threads: int = 1,
               kv_scale_mode: str = "production", attention_backend: str = DEFAULT_BACKEND,
               api_key: str | None = None, max_body: int | None = None) -> FastAPI:
    """`api_key`: every request but /health must carry `Authorization: Bearer <key>` (qverify generates one
    per launch, so another local user cannot use, or load, a server it started). `max_body`: the request-body
    cap in bytes (default guards.body_limit of the model's context)."""
    engine = Engine(loaded.model, loaded.tokenizer, loaded.drafter, max_batch=max_batch, fp8_kv=loaded.fp8_kv,
                    scale_mode=kv_scale_mode, sglang_scales=loaded.sglang_kv_scales, attention_backend=attention_backend)
    srv = Served(engine, EngineWorker(engine, threads=threads), loaded.served_name)
    app = FastAPI(title="qverify local server", max_body_size=max_body or body_limit(engine.max_context))
    app.state.worker = srv.worker
    _answer_errors(app)
    _info_routes(app, srv, {**loaded.info, "kv_scale_mode": kv_scale_mode, "attention_backend": attention_backend})
    _generation_routes(app, srv)
    if api_key:
        app.add_middleware(KeyGuard, api_key=api_key)
    one_traceback_per_kind()
    return app


def _answer_errors(app: FastAPI) -> None:
    """Every refusal in OpenAI's error shape: 400 for a body that does not validate, 413 past the body cap, 499 for
    a client that left (nobody reads it; nothing is logged), 500 for the rest."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return err(400, f"{where}: {first.get('msg', 'invalid request')}")

    @app.exception_handler(HTTPException)
    async def _http(request: Request, exc: HTTPException) -> JSONResponse:
        if exc.status_code == 413:
            return err(413, f"the request body is over this server's cap of {app.max_body_size} bytes "
                            f"({BYTES_PER_CONTEXT_TOKEN} per token of context, qverify.serve.embedded.guards)")
        return err(exc.status_code, str(exc.detail))

    @app.exception_handler(Aborted)
    async def _gone(request: Request, exc: Aborted) -> JSONResponse:
        return err(499, str(exc))

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        return err(500, f"{type(exc).__name__}: {exc}", "server_error")


def _info_routes(app: FastAPI, srv: Served, info: dict[str, Any]) -> None:
    engine, worker = srv.engine, srv.worker

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok"}

    @app.get("/health_generate")
    async def health_generate() -> Any:
        """SGLang's readiness probe: healthy only if the model can generate a token."""
        res = await worker.submit(GenRequest(prompt_ids=[srv.tok.bos_token_id or 0], max_tokens=1))
        return {"status": "ok", "tokens": len(res.token_ids)}

    @app.get("/v1/models")
    async def models() -> dict:
        return {"object": "list", "data": [{"id": srv.name, "object": "model", "owned_by": "qverify",
                                            "max_model_len": engine.max_context}]}

    @app.get("/server_info")
    async def server_info() -> dict:
        return {**info, "max_total_num_tokens": engine.max_context, "max_batch": engine.max_batch,
                "speculative": engine.drafter is not None, "speculative_algorithm": engine.speculative,
                "kv_fp8_latent": engine.runner.fp8_kv, "busy_s": round(worker.busy_s, 3), **engine.stats,
                "running": len(engine.running), "waiting": len(engine.waiting),
                "internal_states": [{"avg_spec_accept_length": engine.avg_accept_length()}]}


def _generation_routes(app: FastAPI, srv: Served) -> None:
    @app.post("/v1/chat/completions")
    async def chat(body: ChatBody, request: Request) -> Any:
        return await chat_completion(srv, body, request)

    @app.post("/v1/completions")
    async def completions(body: CompletionBody, request: Request) -> Any:
        return await completion(srv, body, request)


def _die_with_parent() -> None:
    """Exit when the process that launched us is gone (even if it was SIGKILLed).

    The server runs in its own session so `stop()` can end its whole group; the price is
    that a killed client would leave it orphaned, so it watches its launcher instead.
    """
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
