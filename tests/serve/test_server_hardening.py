"""The embedded server against bad requests and other local users (#31): a real uvicorn server on 127.0.0.1
serving the real (memorised) tiny model, run in this process so it is up in seconds on a loaded box."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from tests import parrot
from tests.serve.embedded_app import embedded_app

KEY = "per-launch-key-for-this-test"
H = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def url(parrot_dir):
    with embedded_app(parrot_dir, KEY) as (base, _, _):
        yield base


def test_another_local_user_cannot_use_the_server(url):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60).status_code == 401
    assert httpx.post(f"{url}/v1/chat/completions", json=body, timeout=60,
                      headers={"Authorization": "Bearer not-the-key"}).status_code == 401
    assert httpx.get(f"{url}/v1/models", timeout=60).status_code == 401
    assert httpx.get(f"{url}/health", timeout=60).status_code == 200  # liveness only
    assert httpx.post(f"{url}/v1/chat/completions", json=body, headers=H, timeout=120).status_code == 200


def test_the_key_is_made_per_launch_and_never_on_the_command_line(parrot_dir, tmp_path):
    import qverify.serve.local as local
    from qverify.models import ServingProfile
    from qverify.serve.local import LocalBackend

    starts = []
    for x in (LocalBackend(parrot_dir, None, ServingProfile(), tmp_path) for _ in range(2)):
        class _Capture:  # what start() hands the process, without waiting for a model load
            def __init__(self, cmd, log, env):
                starts.append((cmd, env))

            def start(self):
                pass

        real, local.LaunchedServer = local.LaunchedServer, _Capture
        try:
            ep = x.start()
        finally:
            local.LaunchedServer = real
        assert ep.api_key == x.api_key and x.headers == {"Authorization": f"Bearer {x.api_key}"}
    (cmd_a, env_a), (cmd_b, env_b) = starts
    assert env_a["QVERIFY_SERVER_KEY"] != env_b["QVERIFY_SERVER_KEY"] and len(env_a["QVERIFY_SERVER_KEY"]) >= 24
    assert env_a["QVERIFY_SERVER_KEY"] not in " ".join(cmd_a)


BAD_BODIES = [
    ("/v1/completions", {"prompt": [5, 10**7, 6], "max_tokens": 2}, "outside the vocabulary"),
    ("/v1/completions", {"prompt": [-1], "max_tokens": 2}, "outside the vocabulary"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": float("nan")}, "temperature"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}, "max_tokens"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "logprobs": True, "top_logprobs": 100000},
     "top_logprobs"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 100000, "echo": True, "max_tokens": 0}, "logprobs"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"}, "temperature"),
]


@pytest.mark.parametrize("path, body, what", BAD_BODIES)
def test_a_bad_request_is_a_400_at_once(url, path, body, what):
    # NaN is not JSON, but the server's json reads the literal; send it as a client would
    r = httpx.post(f"{url}{path}", content=json.dumps(body), timeout=30, headers={**H, "Content-Type": "application/json"})
    assert r.status_code == 400 and what in r.json()["error"]["message"], r.text


def test_one_bad_request_never_fails_the_others(url):
    """12 at once, one with a token id outside the vocabulary: it gets its 400, all 11 others their 200."""

    async def burst():
        async with httpx.AsyncClient(headers=H, timeout=120) as c:
            good = [c.post(f"{url}/v1/chat/completions", json={
                "messages": [{"role": "user", "content": f"{parrot.TEXT_PROMPT} {i}"}], "max_tokens": 8,
                "temperature": 0}) for i in range(11)]
            bad = c.post(f"{url}/v1/completions", json={"prompt": [3, 10**7], "max_tokens": 4})
            rs = await asyncio.wait_for(asyncio.gather(*good[:5], bad, *good[5:]), 120)
            return [r.status_code for r in rs]

    codes = asyncio.run(burst())
    assert codes[5] == 400 and codes[:5] + codes[6:] == [200] * 11, codes


def test_the_engine_refuses_a_bad_sequence_alone(parrot_dir):
    """Below the server's check: a bad request handed straight to the engine fails alone; the others finish."""
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.model_loader import load_for_serving

    lm = load_for_serving(parrot_dir, speculative=False)
    engine = Engine(lm.model, lm.tokenizer, None, max_batch=16)
    ids = lm.tokenizer(parrot.TEXT_PROMPT, add_special_tokens=False)["input_ids"]
    out: dict[int, object] = {}
    for i in range(12):
        req = GenRequest(prompt_ids=[*ids, 10**7] if i == 5 else [*ids, i + 3], max_tokens=4)
        try:
            engine.add(req, lambda res, exc, i=i: out.__setitem__(i, exc or res))
        except ValueError as e:
            out[i] = e
    steps = 0
    while engine.has_work() and steps < 200:
        engine.step()
        steps += 1
    assert isinstance(out[5], ValueError) and "vocabulary" in str(out[5])
    assert sorted(i for i, r in out.items() if not isinstance(r, BaseException)) == [i for i in range(12) if i != 5]
