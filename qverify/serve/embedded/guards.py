"""What stands between a request and the embedded server's handlers: the key, the body cap, the log.

The key is checked by one pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which re-wraps every body and
disconnect); the body cap is FastAPI's own (`FastAPI(max_body_size=)`, Starlette's RequestBodyLimitMiddleware:
a declared Content-Length over the cap is refused before the body is read, a chunked body once past it).
"""

from __future__ import annotations

import hmac
import json
import logging

# The largest legitimate request is a prompt that fills the context. Its JSON costs at most about 64 bytes per
# token: a token is ~4 characters of English (4-5 bytes), 1-2 CJK characters (6-12 bytes as the \uXXXX escapes
# Python's json writes), a surrogate-pair emoji 12 bytes, a run of code indentation up to ~16; a prompt given as
# token ids is at most 8 bytes per id ("163839, "); message and tool structure is counted in its template's
# tokens. Kimi K2's 262,144-token context gives 16 MiB; a floor of 1 MiB keeps small test models usable.
BYTES_PER_CONTEXT_TOKEN = 64
MIN_BODY_BYTES = 2**20


def body_limit(max_context: int) -> int:
    """The request-body cap for a model with `max_context` tokens of context (bytes)."""
    return max(MIN_BODY_BYTES, BYTES_PER_CONTEXT_TOKEN * max_context)


def error_body(status: int, message: str, kind: str = "invalid_request_error") -> dict:
    """OpenAI's error shape, the one every refusal of this server uses."""
    return {"error": {"message": message, "type": kind, "code": status}}


class KeyGuard:
    """ASGI middleware: 401 without `Authorization: Bearer <api_key>` (except /health, liveness only), from the
    headers alone, before any of the body is read."""

    def __init__(self, app, api_key: str):
        self.app, self.expected = app, f"Bearer {api_key}".encode()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "http" and scope["path"] != "/health" and not hmac.compare_digest(
                dict(scope["headers"]).get(b"authorization", b""), self.expected):
            await _refuse(send, 401, "missing or wrong API key", "authentication_error")
            return
        await self.app(scope, receive, send)


async def _refuse(send, status: int, message: str, kind: str = "invalid_request_error") -> None:
    body = json.dumps(error_body(status, message, kind)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class OneTracebackPerKind(logging.Filter):
    """uvicorn logs a full traceback for every 500 (Starlette re-raises after the handler answers). The first of
    each exception type is kept whole; a repeat becomes one line, so a request sent over and over cannot grow the
    log by a traceback each time (#37: one bad request twice a second grew it to 19.7 MB)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None:
            kind = type(exc).__qualname__
            if kind in self.seen:
                record.msg, record.args = f"{record.getMessage()}: {kind}: {str(exc)[:200]} (traceback logged once)", ()
                record.exc_info, record.exc_text = None, None
            self.seen.add(kind)
        return True


def one_traceback_per_kind(logger_name: str = "uvicorn.error") -> None:
    logger = logging.getLogger(logger_name)
    if not any(isinstance(f, OneTracebackPerKind) for f in logger.filters):
        logger.addFilter(OneTracebackPerKind())
