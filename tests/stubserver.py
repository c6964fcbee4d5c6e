"""One way to run a stub HTTP server on 127.0.0.1 in a test: a quiet handler base and a start/stop context.

Stdlib http.server, not FastAPI: the stubs must be able to send bytes no framework would (invalid UTF-8,
truncated JSON, a body that never ends) and to hang without answering. Used by tests/badserver.py
(misbehaving endpoints), tests/suites/conftest.py (a lookup-table model for lm-eval) and
tests/serve/test_endpoint.py (an attached SGLang-like server).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StubHandler(BaseHTTPRequestHandler):
    """A handler that logs nothing and sends bodies with their length."""

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def send_body(self, code: int, body: bytes, ctype: str = "application/json") -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def send_json(self, code: int, obj) -> None:
        self.send_body(code, json.dumps(obj).encode())

    def read_json(self) -> dict:
        return json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")


class StubServer:
    """`handler` served on 127.0.0.1 (a free port) by a daemon thread, from start() to stop()."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]):
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True  # a hanging handler never blocks shutdown
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def start(self) -> StubServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[StubServer]:
    """Serve `handler` for the with-block; yields the running StubServer (its `.url`)."""
    server = StubServer(handler).start()
    try:
        yield server
    finally:
        server.stop()
