"""One serving lifecycle for every backend: start → wait_ready → info → stop, as a context manager.

`LaunchedServer` is the shared helper for backends that run a process (local, sglang):
its own process group, logs under <workdir>/logs/, health-wait with the last log lines
on failure, and a stop that ends the whole group (no orphans).
"""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import time
from abc import ABC, abstractmethod
from collections import deque
from pathlib import Path
from typing import Any, ClassVar

import httpx

from qverify.errors import BadInput, InfraError
from qverify.models import BuildManifest, Endpoint, ServingProfile
from qverify.registry import Registry
from qverify.workdir import open_append


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_port_free(port: int, host: str = "127.0.0.1") -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            raise BadInput(f"port {port} is already in use", fix="pick another --port or omit it to auto-pick") from None


def tail(path: Path, n: int = 50) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n))
    except FileNotFoundError:
        return "(no log)"


class ServerBackend(ABC):
    """A way to serve a build. Subclasses register with `@backends.register(name)`."""

    name: ClassVar[str]

    def __init__(self, build_dir: Path | None, manifest: BuildManifest | None, profile: ServingProfile,
                 logs_dir: Path, port: int | None = None, host: str = "127.0.0.1", trust_remote_code: bool = False):
        # the user's permission for the build's own code (flag or qverify.toml, never build.json): refused here,
        # before any process is launched, when the build needs it
        self.trust_remote_code = trust_remote_code
        self.remote_code = manifest.remote_code(trust_remote_code) if manifest is not None else False
        self.build_dir = build_dir
        self.manifest = manifest
        self.profile = profile
        self.logs_dir = logs_dir
        self.host = host
        self.port = port
        self.endpoint: Endpoint | None = None

    @abstractmethod
    def start(self) -> Endpoint:
        """Launch (or attach) and return the endpoint; does not wait for readiness."""

    @abstractmethod
    def wait_ready(self, timeout: float = 600.0) -> None:
        """Block until the server answers generation requests, or raise InfraError."""

    @abstractmethod
    def info(self) -> dict[str, Any]:
        """Server info: build id, KV capacity (max_total_num_tokens), avg_spec_accept_length, ..."""

    @abstractmethod
    def stop(self) -> None:
        """Stop what start() launched. Idempotent."""

    # where the server's log goes (a launched process's output, an endpoint's probe log); None before start()
    log_path: Path | None = None

    def command(self) -> list[str] | None:
        """The launch command, for launched backends (recorded in the RunManifest)."""
        return None

    def redacted_command(self) -> list[str] | None:
        """The launch command as recorded in manifests, with secrets shown as ${VAR}."""
        return self.command()

    def shell_lines(self) -> list[str]:
        """What `qverify serve --dry-run` prints: one runnable shell line per process (none when attaching)."""
        cmd = self.command()
        return [shlex.join(cmd)] if cmd else []

    def alive(self) -> bool:
        return True

    def __enter__(self) -> Endpoint:
        ep = self.start()
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return ep

    def __exit__(self, *exc: object) -> None:
        self.stop()


class LaunchedServer:
    """A server process in its own session/process group, logging to a file."""

    def __init__(self, cmd: list[str], log_path: Path, env: dict[str, str] | None = None, cwd: Path | None = None):
        self.cmd = cmd
        self.log_path = log_path
        self.env = env
        self.cwd = cwd
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open_append(self.log_path)  # never through a symlink out of the workdir (#37)
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=self.env, cwd=self.cwd)
        log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_http(self, url: str, timeout: float, ok=lambda r: r.status_code == 200, headers: dict | None = None) -> None:
        deadline = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < deadline:
            if not self.alive():
                raise InfraError(f"server exited with code {self.proc.returncode if self.proc else '?'} before it was ready; "
                                 f"last log lines:\n{tail(self.log_path)}", fix=f"see the full log at {self.log_path}")
            try:
                r = httpx.get(url, timeout=5.0, headers=headers)
                if ok(r):
                    return
                last = f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                last = type(e).__name__
            time.sleep(0.5)
        self.stop()
        raise InfraError(f"server not ready after {timeout:.0f}s ({last}); last log lines:\n{tail(self.log_path)}",
                         fix=f"see the full log at {self.log_path}")

    def stop(self, grace_s: float = 10.0) -> None:
        if not self.proc:
            return
        try:
            pgid = os.getpgid(self.proc.pid)
        except ProcessLookupError:
            pgid = None
        if pgid is not None:
            for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(pgid, sig)
                except ProcessLookupError:
                    break
                try:
                    self.proc.wait(timeout=wait)
                    # the leader is gone; make sure no child of the group survives it
                    os.killpg(pgid, signal.SIGKILL)
                except (subprocess.TimeoutExpired, ProcessLookupError):
                    continue
                break
        self.proc = None


backends: Registry[type[ServerBackend]] = Registry("serving backend")

