"""Real HTTP servers on 127.0.0.1 that misbehave the way real endpoints do.

Stdlib http.server rather than FastAPI: these must send bytes no framework would
(invalid UTF-8, truncated JSON, HTML with a 200) and hang without answering.

  canned   every chat/completion request gets one valid, fixed answer (streamed too)
  garbage  each distinct request body gets the next shape of GARBAGE (the same shape
           again on a retry), shape 0 being a valid answer; GETs answer garbage too
           except the health probe
  hang     POSTs sleep for `hang_s` before answering; GETs (health) answer at once
  echo     POSTs get a 400 whose body echoes the request's headers (the API key among them), as some
           gateways do in their error messages
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CODE = "```python\ndef f(x):\n    return x\n```"


def completion(content: str = CODE) -> bytes:
    return json.dumps({"id": "x", "object": "chat.completion", "model": "m",
                       "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                                    "finish_reason": "stop"}],
                       "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}).encode()


def stream(content: str = CODE) -> bytes:
    chunks = [{"choices": [{"index": 0, "delta": {"content": content}}]},
              {"choices": [], "usage": {"completion_tokens": 5}}]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


# (content type, body) of a 200 response; every shape a broken server or proxy has been seen to send
GARBAGE: list[tuple[str, bytes]] = [
    ("application/json", completion("hello")),
    ("application/json", b'{"choices": [null]}'),
    ("application/json", b'{"choices": null}'),
    ("application/json", b'{"id": "x"}'),  # no choices at all
    ("application/json", b'{"choices": []}'),
    ("application/json", b'{"choices": [{"message": {"content": 42}}]}'),
    ("application/json", b'{"choices": [{"message": "hello"}]}'),
    ("application/json", b'{"choices": [{"message": {"tool_calls": [{"function": null}]}}]}'),
    ("application/json", b'{"choices": [{"message": {"tool_calls": "read_file"}}]}'),
    ("application/json", b'{"choices": [{"message": {"tool_calls": [{"function": {"name": 5, "arguments": {"a": 1}}}]}}]}'),
    ("application/json", b'{"choices": [{"message": {"content": "x"}, "logprobs": {"content": [{"token": 1}]}}]}'),
    ("application/json", b'{"choices": [{"message": {"content": "ok"}}], "usage": "lots"}'),
    ("application/json", b'[1, 2, 3]'),
    ("application/json", b'"just a string"'),
    ("application/json", b'{"choices": [{"message": {"content": "\xff\xfe bad utf-8 \xc3"}}]}'),
    ("text/html", b"<html><body><h1>502 Bad Gateway</h1></body></html>"),
    ("application/json", b'{"choices": [{"message": {"content": "trunc'),
    ("application/json", b""),
]

GARBAGE_STREAM = [b"data: [1, 2]\n\n", b"data: {\"choices\": [null]}\n\n", b"data: \xff\xfe\n\n", b"data: {trunc"]


class BadServer:
    def __init__(self, mode: str = "canned", hang_s: float = 60.0):
        self.mode, self.hang_s = mode, hang_s
        self.posts = 0
        self.seen: dict[bytes, int] = {}
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):  # quiet
                pass

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                if self.path in ("/health", "/health_generate"):
                    return self._send(200, "text/plain", b"ok")
                if outer.mode == "garbage":  # /v1/models, /server_info: not what anyone expects
                    return self._send(200, "application/json", b'{"data": [null], "\xff": ')
                return self._send(404, "application/json", b'{"error": "not found"}')

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts += 1
                req = json.loads(body or b"{}")
                streamed = bool(req.pop("stream", False))
                if outer.mode == "echo":
                    headers = json.dumps(dict(self.headers.items()))
                    return self._send(400, "application/json", json.dumps({"error": f"bad request {headers}"}).encode())
                if outer.mode == "hang":
                    time.sleep(outer.hang_s)
                    try:
                        return self._send(200, "application/json", completion())
                    except OSError:  # the client gave up long ago
                        return None
                if outer.mode == "canned":
                    if streamed:
                        return self._send(200, "text/event-stream", stream())
                    return self._send(200, "application/json", completion())
                req.pop("stream_options", None)
                n = outer.seen.setdefault(json.dumps(req, sort_keys=True).encode(), len(outer.seen))
                if streamed:
                    return self._send(200, "text/event-stream", GARBAGE_STREAM[n % len(GARBAGE_STREAM)])
                ctype, payload = GARBAGE[n % len(GARBAGE)]
                return self._send(200, ctype, payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> BadServer:
        self.thread.start()
        return self

    def __exit__(self, *a) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
