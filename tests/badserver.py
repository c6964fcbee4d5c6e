"""Real HTTP servers on 127.0.0.1 that misbehave the way real endpoints do.

Stdlib http.server rather than FastAPI: these must send bytes no framework would
(invalid UTF-8, truncated JSON, HTML with a 200) and hang without answering.

  canned   every chat/completion request gets one valid, fixed answer (streamed too)
  anonymous as canned, but the answers carry no `model` (and /v1/models is a 404): a server that names no model
  garbage  each distinct request body gets the next shape of GARBAGE (the same shape
           again on a retry), shape 0 being a valid answer; GETs answer garbage too
           except the health probe
  hang     POSTs sleep for `hang_s` before answering; GETs (health) answer at once
  endless  POSTs answer 200 with a chunked body that never ends (until the client hangs up)
  huge     POSTs answer 200 with a Content-Length body of `huge_mb` MB
  gzipbomb POSTs answer 200 with a small gzip body that decodes to `huge_mb` MB
  badgzip  POSTs answer a valid plain JSON completion labelled Content-Encoding: gzip
  ratelimit the first POST of each body answers 429 with Retry-After `retry_after`; the next a completion;
           `post_times` records when each POST arrived
  echo     POSTs get a 400 whose body echoes the request's headers (the API key among them), as some
           gateways do in their error messages
  echoenc  as echo, with the Authorization header echoed encoded: JSON-escaped the PHP way (`\\/`),
           percent-encoded, and base64
"""

from __future__ import annotations

import base64
import json
import time
import zlib
from urllib.parse import quote

from tests.stubserver import StubHandler, StubServer

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


def _gzip_bomb(mb: int) -> bytes:
    """gzip of `mb` MB of spaces, built 1 MB at a time so the test process never holds the decoded size."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = b" " * 2**20
    return b"".join(z.compress(block) for _ in range(mb)) + z.flush()


class BadServer:
    def __init__(self, mode: str = "canned", hang_s: float = 60.0, huge_mb: int = 256, retry_after: str = "2",
                 content: str = CODE):
        self.mode, self.hang_s, self.huge_mb, self.retry_after = mode, hang_s, huge_mb, retry_after
        self.content = content  # the canned answer
        self.posts = 0
        self.post_times: list[float] = []
        # the bomb is built once: 1 MB of gzip that decodes to huge_mb MB of spaces (valid JSON whitespace)
        self._bomb = _gzip_bomb(huge_mb) if mode == "gzipbomb" else b""
        self.seen: dict[bytes, int] = {}
        outer = self

        class Handler(StubHandler):
            protocol_version = "HTTP/1.1"

            def _send(self, code: int, ctype: str, body: bytes) -> None:
                self.send_body(code, body, ctype)

            def do_GET(self):
                if self.path in ("/health", "/health_generate"):
                    return self._send(200, "text/plain", b"ok")
                if outer.mode == "garbage":  # /v1/models, /server_info: not what anyone expects
                    return self._send(200, "application/json", b'{"data": [null], "\xff": ')
                return self._send(404, "application/json", b'{"error": "not found"}')

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts += 1
                outer.post_times.append(time.monotonic())
                if outer.mode in ("endless", "huge", "gzipbomb", "badgzip", "ratelimit"):
                    return self._hostile(body)
                req = json.loads(body or b"{}")
                streamed = bool(req.pop("stream", False))
                if outer.mode == "echoenc":
                    auth = self.headers.get("Authorization", "")
                    forms = [json.dumps(auth).replace("/", "\\/"), quote(auth, safe=""),
                             base64.b64encode(auth.encode()).decode()]
                    return self._send(400, "application/json", ('{"error": "bad auth %s"}' % " ".join(forms)).encode())
                if outer.mode == "echo":
                    headers = json.dumps(dict(self.headers.items()))
                    return self._send(400, "application/json", json.dumps({"error": f"bad request {headers}"}).encode())
                if outer.mode == "hang":
                    time.sleep(outer.hang_s)
                    try:
                        return self._send(200, "application/json", completion())
                    except OSError:  # the client gave up long ago
                        return None
                if outer.mode == "anonymous":
                    answer = {k: v for k, v in json.loads(completion(outer.content)).items() if k != "model"}
                    return self._send(200, "application/json", json.dumps(answer).encode())
                if outer.mode == "canned":
                    if streamed:
                        return self._send(200, "text/event-stream", stream(outer.content))
                    return self._send(200, "application/json", completion(outer.content))
                req.pop("stream_options", None)
                n = outer.seen.setdefault(json.dumps(req, sort_keys=True).encode(), len(outer.seen))
                if streamed:
                    return self._send(200, "text/event-stream", GARBAGE_STREAM[n % len(GARBAGE_STREAM)])
                ctype, payload = GARBAGE[n % len(GARBAGE)]
                return self._send(200, ctype, payload)

            def _hostile(self, body: bytes) -> None:
                try:
                    if outer.mode == "ratelimit":
                        n = outer.seen.setdefault(body, 0)
                        outer.seen[body] = n + 1
                        if n == 0:
                            self.send_response(429)
                            self.send_header("Retry-After", outer.retry_after)
                            self.send_header("Content-Length", "2")
                            self.end_headers()
                            self.wfile.write(b"{}")
                            return
                        return self._send(200, "application/json", completion())
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    if outer.mode == "badgzip":
                        self.send_header("Content-Encoding", "gzip")
                        return self._send_body(completion())
                    if outer.mode == "gzipbomb":
                        self.send_header("Content-Encoding", "gzip")
                        return self._send_body(outer._bomb)
                    block = b" " * 2**20
                    if outer.mode == "huge":
                        self.send_header("Content-Length", str(outer.huge_mb * 2**20))
                        self.end_headers()
                        for _ in range(outer.huge_mb):
                            self.wfile.write(block)
                        return
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    chunk = f"{len(block):x}\r\n".encode() + block + b"\r\n"
                    while True:  # endless: only the client hanging up stops it
                        self.wfile.write(chunk)
                except OSError:  # the client stopped reading: what a capped client does
                    self.close_connection = True

            def _send_body(self, payload: bytes) -> None:
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = StubServer(Handler)

    @property
    def url(self) -> str:
        return self.server.url

    def __enter__(self) -> BadServer:
        self.server.start()
        return self

    def __exit__(self, *a) -> None:
        self.server.stop()
