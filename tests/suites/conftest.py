"""Fixtures for suite tests.

`stub_openai` is a small deterministic OpenAI-compatible HTTP server on 127.0.0.1 that
answers from a lookup table. It stands in for a served model at the HTTP boundary (the
thing under test is the lm-eval adapter, not a model); it speaks the real protocol over a
real socket, so lm-eval's own HTTP client, retries and parsing all run.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.stubserver import StubHandler, serving

# question text (a substring of the prompt) -> answer the stub "model" gives
ANSWERS = {
    "capital of France": "Paris",
    "2 + 2": "4",
    "opposite of hot": "cold",
    "color of the sky": "green",  # deliberately wrong: the gold answer is blue
    "largest planet": "Jupiter",
    "language is qverify written in": "Python",
}
UNKNOWN = "I do not know"


@dataclass
class StubServer:
    base_url: str
    requests: list[dict] = field(default_factory=list)
    fail_status: int | None = None  # answer every POST with this HTTP status when set

    def answer(self, prompt: str) -> str:
        hits = [a for q, a in ANSWERS.items() if q in prompt]
        return hits[-1] if hits else UNKNOWN  # last hit: few-shot prompts repeat earlier questions


def _handler(server: StubServer) -> type[StubHandler]:
    class Handler(StubHandler):
        _send = StubHandler.send_json

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": "stub", "object": "model"}]})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            body = self.read_json()
            server.requests.append({"path": self.path, "body": body})
            if server.fail_status:
                self._send(server.fail_status, {"error": {"message": "stub failure", "type": "invalid_request_error"}})
                return
            if self.path.endswith("/chat/completions"):
                text = server.answer(body["messages"][-1]["content"])
                self._send(
                    200,
                    {
                        "id": "c",
                        "object": "chat.completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                        ],
                        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
                    },
                )
            elif self.path.endswith("/completions"):
                prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
                self._send(
                    200,
                    {
                        "id": "c",
                        "object": "text_completion",
                        "model": body.get("model"),
                        "choices": [
                            {"index": i, "finish_reason": "stop", "text": " " + server.answer(p), "logprobs": None}
                            for i, p in enumerate(prompts)
                        ],
                    },
                )
            else:
                self._send(404, {"error": "not found"})

    return Handler


@pytest.fixture(scope="module")
def stub_openai() -> Iterator[StubServer]:
    server = StubServer(base_url="")
    with serving(_handler(server)) as running:
        server.base_url = f"{running.url}/v1"
        yield server


from tests.evals.conftest import bf16_build, eval_workdir  # noqa: F401  (a real build for CLI eval tests)
