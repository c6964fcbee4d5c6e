"""local: the embedded CPU server, launched as its own process (python -m qverify.serve.embedded.server)."""

from __future__ import annotations

import os
import secrets
import sys
import time
from typing import Any

import httpx

from qverify.models import Endpoint
from qverify.scrub import register
from qverify.serve.base import LaunchedServer, ServerBackend, backends, check_port_free, free_port
from qverify.serve.openai_http import KEY_ENV, auth_headers


@backends.register("local")
class LocalBackend(ServerBackend):
    name = "local"

    def command(self) -> list[str]:
        flags = self.profile.flags
        cmd = [sys.executable, "-m", "qverify.serve.embedded.server", "--build", str(self.build_dir),
               "--host", self.host, "--port", str(self.port or 0)]
        if flags.get("threads"):
            cmd += ["--threads", str(flags["threads"])]
        if flags.get("max_batch"):
            cmd += ["--max-batch", str(flags["max_batch"])]
        if self.remote_code:
            cmd.append("--trust-remote-code")
        if flags.get("attention_backend"):
            cmd += ["--attention-backend", flags["attention_backend"]]
        if flags.get("no_quant"):
            cmd.append("--no-quant")
        if flags.get("no_spec") or flags.get("speculative") is False:
            cmd.append("--no-spec")
        elif flags.get("speculative"):
            cmd.append("--spec")
        return cmd

    def start(self) -> Endpoint:
        from qverify.quantize.text_view import check_servable

        check_servable(self.build_dir)  # a wrapper it cannot serve: one line and exit 4 here, not a traceback in a log
        if self.port is None:
            self.port = free_port()
        else:
            check_port_free(self.port, self.host)
        name = self.manifest.build_id if self.manifest else self.build_dir.name
        log = self.logs_dir / f"local-{name}-{time.strftime('%Y%m%d-%H%M%S')}.log"
        # a fresh key per launch, handed over in the environment (argv is readable by every local user): another
        # user on the machine cannot send requests to, or load, a server qverify started
        self.api_key = secrets.token_urlsafe(24)
        register(self.api_key)  # never stored, even when an error body echoes it
        env = {**os.environ, "QVERIFY_PARENT_PID": str(os.getpid()), KEY_ENV: self.api_key}
        self.server = LaunchedServer(self.command(), log, env=env)
        self.server.start()
        self.endpoint = Endpoint(base_url=f"http://{self.host}:{self.port}/v1", model=name, api_key=self.api_key)
        return self.endpoint

    @property
    def headers(self) -> dict[str, str]:
        """What a request to this server must carry (its per-launch key)."""
        return auth_headers(getattr(self, "api_key", None))

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def wait_ready(self, timeout: float = 300.0) -> None:
        self.server.wait_http(f"{self.root_url}/health", timeout)

    def info(self) -> dict[str, Any]:
        try:
            return httpx.get(f"{self.root_url}/server_info", timeout=10, headers=self.headers).json()
        except httpx.HTTPError:
            return {}

    def alive(self) -> bool:
        return self.server.alive()

    def stop(self) -> None:
        if getattr(self, "server", None):
            self.server.stop()

    @property
    def log_path(self):
        return self.server.log_path
