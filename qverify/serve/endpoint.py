"""endpoint: attach to a server or router that is already running; nothing is launched.

For example sglang-router (`--policy cache_aware`) in front of data-parallel SGLang replicas,
or a cluster service. Readiness is still checked, and `info()` reads /server_info (or the
older /get_server_info) when the server has one.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from qverify.errors import BadInput, InfraError
from qverify.models import Endpoint
from qverify.scrub import scrub_text, shown_url
from qverify.serve.base import ServerBackend, backends
from qverify.serve.openai_http import (
    READY_PATHS,
    auth_headers,
    fetch_server_info,
    probe_ready,
    read_api_key,
    root_url,
    summarize_info,
)
from qverify.workdir import open_append


def check_endpoint_url(url: str | None) -> None:
    """Bad input unless `url` is an http(s) URL with a host and a valid port; the message never shows a password."""
    if not url:
        raise BadInput("the endpoint backend needs a URL", fix="pass --endpoint http://HOST:PORT")
    try:
        parts = urlsplit(url)
        ok = parts.scheme in ("http", "https") and bool(parts.hostname)
        parts.port  # noqa: B018 (raises ValueError on a port out of range)
    except ValueError:  # a bad IPv6 host, a port out of range
        ok = False
    if not ok:
        raise BadInput(f"--endpoint {shown_url(url)!r} is not an http(s) URL",
                       fix="pass e.g. --endpoint http://10.0.0.5:30000")


@backends.register("endpoint")
class EndpointBackend(ServerBackend):
    name = "endpoint"

    def start(self) -> Endpoint:
        url = self.profile.endpoint
        check_endpoint_url(url)
        self.root = root_url(url)
        self.shown = shown_url(self.root)  # no user:pass@ in logs, messages or the log's name
        self.api_key = read_api_key(self.profile.api_key_env)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        host = urlsplit(self.shown).netloc.replace(":", "_")
        self.log_path: Path = self.logs_dir / f"endpoint-{host}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        model = self.manifest.build_id if self.manifest else (self.build_dir.name if self.build_dir else "default")
        model = self.profile.served_model or model  # declared by the user: the name requests ask for
        self.endpoint = Endpoint(base_url=f"{self.root}/v1", model=model, api_key=self.api_key or "EMPTY")
        self._log(f"attach {self.shown} (nothing launched)")
        return self.endpoint

    def _log(self, line: str) -> None:
        with open_append(self.log_path, text=True) as f:  # never through a symlink out of the workdir (#37)
            f.write(f"{time.strftime('%H:%M:%S')} {scrub_text(line)}\n")

    def wait_ready(self, timeout: float = 60.0, unreachable_s: float = 5.0) -> None:
        """An attached server is already up: if nothing answers within `unreachable_s` it is not there.

        One that answers but is not ready yet (HTTP 503 while loading) gets up to `timeout`.
        """
        t0 = time.monotonic()
        probes, answered = 0, False
        while True:
            left = max(0.5, unreachable_s - (time.monotonic() - t0))
            ready, detail = probe_ready(self.root, auth_headers(self.api_key), timeout=min(5.0, left))
            probes += 1
            answered = answered or "HTTP" in detail
            self._log(f"probe {detail}")
            if ready:
                self._pick_model()
                return
            waited = time.monotonic() - t0
            if waited >= (timeout if answered else unreachable_s):
                state = "was not ready" if answered else "did not answer"
                raise InfraError(f"endpoint {self.shown} {state} within {waited:.0f}s ({probes} probes of "
                                 f"{', '.join(READY_PATHS)}; last: {detail})",
                                 fix=f"check the server or router is up and reachable from here: curl {self.shown}/health")
            time.sleep(min(1.0, unreachable_s / 5))

    def _pick_model(self) -> None:
        """Use the served model's own name: the build id if listed, else the only model there is."""
        try:
            ids = [m["id"] for m in httpx.get(f"{self.root}/v1/models", headers=auth_headers(self.api_key),
                                              timeout=10.0).json().get("data", [])]
        except (httpx.HTTPError, ValueError, KeyError, TypeError, AttributeError):
            return
        if self.endpoint:
            self.endpoint.listed_models = sorted({i for i in ids if isinstance(i, str) and i})
        if self.endpoint and not self.profile.served_model and self.endpoint.model not in ids and len(ids) == 1:
            self._log(f"model {self.endpoint.model!r} not listed; using the served {ids[0]!r}")
            self.endpoint.model = ids[0]  # in place: callers hold the Endpoint start() returned

    def info(self) -> dict[str, Any]:
        secrets = [self.api_key] if self.api_key else []
        return summarize_info(fetch_server_info(self.root, auth_headers(self.api_key), secrets))

    def alive(self) -> bool:
        try:
            return probe_ready(self.root, auth_headers(self.api_key), timeout=10.0)[0]
        except BadInput:
            return False

    def stop(self) -> None:
        """Nothing was launched, so nothing is stopped."""
