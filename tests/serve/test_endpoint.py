"""The endpoint backend against a real HTTP server on 127.0.0.1.

The server is a small stand-in for a remote SGLang server or sglang-router (a boundary that
cannot exist here): it speaks the real paths over a real socket, checks the bearer key, and can
be told to be unready, to lack paths, or to have no info endpoint.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from qverify.errors import BadInput, InfraError
from qverify.models import BuildManifest, RunManifest, Sampling
from qverify.serve import get_backend
from qverify.serve.openai_http import spec_meta, with_meta_info
from qverify.serve.profile import resolve_profile
from tests.stubserver import StubHandler, serving

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-endpoint-secret-77"


@dataclass
class Remote:
    """What the stand-in server does; tests flip these between requests."""

    port: int = 0
    key: str | None = KEY
    status: dict[str, int] = field(default_factory=dict)  # path -> forced status (404 = path missing)
    models: list[str] = field(default_factory=lambda: ["b-endpoint"])
    info_path: str | None = "/server_info"
    hits: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _handler(remote: Remote):
    class H(StubHandler):
        _send = StubHandler.send_json

        def _authorized(self) -> bool:
            remote.hits.append(self.path)
            if remote.key and self.headers.get("Authorization") != f"Bearer {remote.key}":
                self._send(401, {"error": {"message": "invalid api key"}})
                return False
            if self.path in remote.status:
                self._send(remote.status[self.path], {})
                return False
            return True

        def do_GET(self):
            if not self._authorized():
                return
            if self.path in ("/health_generate", "/health"):
                return self._send(200, {})
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": m} for m in remote.models]})
            if self.path == remote.info_path:  # SGLang lists every resolved arg, the key among them
                return self._send(200, {"launch_command": f"python -m sglang.launch_server --api-key {KEY}",
                                        "api_key": KEY, "tp_size": 4, "max_total_num_tokens": 812_000,
                                        "kv_cache_dtype": "fp8_e4m3", "hicache_io_backend": "kernel",
                                        "internal_states": [{"avg_spec_accept_length": 3.1, "note": [1, 2]}]})
            self._send(404, {})

        def do_POST(self):
            if not self._authorized():
                return
            body = self.read_json()
            choice = {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
            if body.get("return_meta_info"):
                choice["meta_info"] = {"spec_accept_length": 2.75, "spec_verify_ct": 4, "completion_tokens": 11,
                                       "id": "x"}
            self._send(200, {"id": "c", "object": "chat.completion", "choices": [choice]})

    return H


@pytest.fixture
def remote() -> Iterator[Remote]:
    r = Remote()
    with serving(_handler(r)) as srv:
        r.port = srv.httpd.server_address[1]
        yield r


def attach(tmp_path: Path, url: str, key_env: str | None = "QV_EP_KEY"):
    prof = resolve_profile(endpoint=url, api_key_env=key_env)
    m = BuildManifest(build_id="b-endpoint", recipe="bf16", recipe_hash="h", recipe_text="", source_model="t",
                      source_hash="s")
    return get_backend("endpoint")(None, m, prof, tmp_path / "logs"), prof


def test_attach_ready_info_and_no_secret_recorded(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("QV_EP_KEY", KEY)
    b, prof = attach(tmp_path, remote.url + "/v1/")
    with b as ep:
        assert ep.base_url == remote.url + "/v1" and ep.model == "b-endpoint" and ep.api_key == KEY
        info = b.info()
        assert b.alive() and b.command() is None
    assert remote.hits[0] == "/health_generate"  # the real-generation check comes first
    assert info["max_total_num_tokens"] == 812_000 and info["avg_spec_accept_length"] == 3.1
    assert info["internal_states"] == [{"avg_spec_accept_length": 3.1}]
    assert "hicache_io_backend" not in info and "api_key" not in info and info["launch_command"].endswith("--api-key ***")
    run = RunManifest(build_id="b-endpoint", suite="coding", suite_version="1", item_set_hash="x", n_items=1,
                      replicates=1, sampling=Sampling(), serving=prof, server_command=b.command(), server_info=info)
    recorded = run.model_dump_json() + ep.model_dump_json() + "".join(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert KEY not in recorded and "QV_EP_KEY" in recorded


def test_meta_info_helpers(remote):
    body = with_meta_info({"model": "b-endpoint", "messages": [{"role": "user", "content": "hi"}]})
    r = httpx.post(remote.url + "/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {KEY}"})
    assert spec_meta(r.json()) == {"spec_accept_length": 2.75, "spec_verify_ct": 4, "completion_tokens": 11}
    plain = httpx.post(remote.url + "/v1/chat/completions", json={"messages": []}, headers={"Authorization": f"Bearer {KEY}"})
    assert spec_meta(plain.json()) == {}


def test_falls_back_to_the_paths_a_router_has(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("QV_EP_KEY", KEY)
    remote.status = {"/health_generate": 404, "/health": 404}
    remote.models = ["served-by-router"]
    remote.info_path = "/get_server_info"
    b, _ = attach(tmp_path, remote.url)
    with b as ep:
        assert ep.model == "served-by-router"  # the only model the router serves
        assert b.info()["tp_size"] == 4
    remote.info_path = None
    with b:
        assert b.info() == {}


def test_not_ready_fails_with_the_probe_log(tmp_path, remote, monkeypatch):
    monkeypatch.setenv("QV_EP_KEY", KEY)
    remote.status = {"/health_generate": 503}  # SGLang answers 503 while it starts
    b, _ = attach(tmp_path, remote.url)
    b.start()
    with pytest.raises(InfraError) as e:
        b.wait_ready(timeout=2)
    assert "was not ready within" in str(e.value) and "last: GET /health_generate: HTTP 503" in str(e.value)
    assert "\n" not in str(e.value)  # one line; every probe is in the endpoint log
    assert "probe GET /health_generate: HTTP 503" in b.log_path.read_text()
    assert "/health" not in remote.hits  # the 503 from /health_generate is authoritative
    assert not b.alive()


def test_nothing_listening(tmp_path):
    b, _ = attach(tmp_path, "http://127.0.0.1:9", key_env=None)
    b.start()
    with pytest.raises(InfraError, match="ConnectError"):
        b.wait_ready(timeout=1)


def test_key_problems_are_bad_input(tmp_path, remote, monkeypatch):
    b, _ = attach(tmp_path, remote.url)
    with pytest.raises(BadInput, match="QV_EP_KEY"):  # variable not set
        b.start()
    monkeypatch.setenv("QV_EP_KEY", "wrong")
    b.start()
    with pytest.raises(BadInput, match="refused the API key"):
        b.wait_ready(timeout=5)


@pytest.mark.parametrize("args, message", [
    ({"backend": "endpoint"}, "needs a URL"),
    ({"backend": "sglang", "endpoint": "http://x:1"}, "--endpoint applies to the endpoint backend"),
    ({"backend": "endpont"}, "did you mean 'endpoint'"),
])
def test_resolve_profile_bad_input(args, message):
    with pytest.raises(BadInput, match=message):
        resolve_profile(**args)


def test_cli_attaches_and_stops_on_ctrl_c(tmp_path, remote):
    d = tmp_path / "builds" / "b-endpoint"
    d.mkdir(parents=True)
    d.joinpath("build.json").write_text(BuildManifest(build_id="b-endpoint", recipe="bf16", recipe_hash="h",
                                                      recipe_text="", source_model="t", source_hash="s").model_dump_json())
    proc = subprocess.Popen([sys.executable, "-m", "qverify", "--workdir", str(tmp_path), "--json", "serve", "b-end",
                             "--backend", "endpoint", "--endpoint", remote.url, "--api-key-env", "QV_EP_KEY"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            env={**os.environ, "QV_EP_KEY": KEY})
    try:
        lines = []
        while not lines or lines[-1] != "}\n":
            lines.append(proc.stdout.readline())
            assert lines[-1], proc.stderr.read()
        doc = json.loads("".join(lines))
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert doc["endpoint"] == remote.url + "/v1" and doc["model"] == "b-endpoint" and doc["command"] is None
    assert doc["info"]["avg_spec_accept_length"] == 3.1
    assert proc.returncode == 0 and KEY not in "".join(lines) + out + err
