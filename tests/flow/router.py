"""A model router on 127.0.0.1 in front of real embedded servers: the stand-in for sglang-router with one SGLang
server per build (docs/serve.md, "Attaching to a running server or router").

Requests name their model; the router forwards each to that build's server with the server's own per-launch key,
and takes one key of its own (what `api_key_env` names). GET /v1/models lists every model; other GETs (health,
server info) go to the first server.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections import Counter
from typing import Self

from fastapi import Request


class ModelRouter:
    def __init__(self, upstreams: dict[str, tuple[str, str]]):
        """`upstreams`: model name -> (the server's root URL, its API key); filled in while the router runs."""
        import httpx
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, Response

        from qverify.serve.base import free_port

        self.key = secrets.token_urlsafe(16)
        self.hits: Counter[str] = Counter()  # generation requests per model
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def route(path: str, request: Request):
            if request.headers.get("authorization") != f"Bearer {self.key}":
                return JSONResponse({"error": {"message": "invalid api key"}}, status_code=401)
            body = await request.body()
            if request.method == "GET" and path == "v1/models":
                return JSONResponse({"object": "list", "data": [{"id": m, "object": "model"} for m in upstreams]})
            model = json.loads(body).get("model") if request.method == "POST" and body else next(iter(upstreams), None)
            if model not in upstreams:
                return JSONResponse({"error": {"message": f"model {model!r} not served"}}, status_code=404)
            self.hits[model] += request.method == "POST"
            url, key = upstreams[model]
            async with httpx.AsyncClient(timeout=600) as c:
                r = await c.request(request.method, f"{url}/{path}", content=body,
                                    headers={"content-type": "application/json", "authorization": f"Bearer {key}"})
            return Response(r.content, status_code=r.status_code, media_type="application/json")

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
