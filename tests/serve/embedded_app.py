"""The embedded server run in-process on 127.0.0.1 (uvicorn in a thread), for tests that send it real requests."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def embedded_app(model_dir: Path, api_key: str) -> Iterator[tuple[str, int, object]]:
    """(base URL, port, the FastAPI app) of the real embedded server on a free port; stopped on exit."""
    import uvicorn

    from qverify.serve.base import free_port
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.serve.embedded.server import create_app

    app = create_app(load_for_serving(model_dir, speculative=False), api_key=api_key)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 120
    while not srv.started and time.monotonic() < deadline:
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", port, app
    finally:
        srv.should_exit = True
        thread.join(10)
