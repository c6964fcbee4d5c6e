"""Fixtures for runner tests: a real bf16 build of a tiny model and a real local server."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from fastapi import Request  # module level: annotations are strings here and FastAPI resolves them in globals


@pytest.fixture(scope="session")
def eval_workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("evalwd")


@pytest.fixture(scope="session")
def bf16_build(tiny_model_dir, eval_workdir):
    from qverify.quantize.build import build

    return build("bf16", model=tiny_model_dir, workdir=eval_workdir)


class FaultyProxy:
    """A real HTTP proxy on 127.0.0.1 in front of a real server that injects faults.

    `fail_first[n]`: the first n attempts of each distinct request body answer 500;
    bodies containing `always_fail` always answer 500; `hang_first` attempts sleep
    past the client's timeout. It also records the peak number of requests in flight.
    """

    def __init__(self, upstream: str, fail_first: int = 1, hang_first: int = 0, always_fail: str | None = None,
                 hang_s: float = 3.0):
        import httpx
        import uvicorn
        from fastapi import FastAPI
        from fastapi.responses import JSONResponse, Response

        self.upstream, self.in_flight, self.peak, self.calls = upstream.rstrip("/"), 0, 0, 0
        seen: dict[bytes, int] = {}
        app = FastAPI()

        @app.api_route("/{path:path}", methods=["GET", "POST"])
        async def proxy(path: str, request: Request):
            import asyncio

            body = await request.body()
            self.calls += 1
            n = seen.get(body, 0)
            seen[body] = n + 1
            if request.method == "POST":
                if always_fail and always_fail.encode() in body:
                    return JSONResponse({"error": "injected"}, status_code=500)
                if n < hang_first:  # the client times out and retries; this answer goes nowhere
                    await asyncio.sleep(hang_s)
                    return JSONResponse({"error": "injected hang"}, status_code=504)
                if n < hang_first + fail_first:
                    return JSONResponse({"error": "injected"}, status_code=503)
                self.in_flight += 1  # generation requests the client is waiting on
                self.peak = max(self.peak, self.in_flight)
            try:
                async with httpx.AsyncClient(timeout=300) as c:
                    auth = {k: v for k, v in request.headers.items() if k == "authorization"}  # the server's key
                    r = await c.request(request.method, f"{self.upstream}/{path}", content=body,
                                        headers={"content-type": "application/json", **auth})
                return Response(r.content, status_code=r.status_code, media_type="application/json")
            finally:
                if request.method == "POST":
                    self.in_flight -= 1

        from qverify.serve.base import free_port

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        while not self.server.started:
            time.sleep(0.05)
        return self

    def __exit__(self, *a):
        self.server.should_exit = True
        self.thread.join(timeout=10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"
