"""The launched-server lifecycle: process groups, readiness failures, ports, secrets, the foreground CLI.

Real processes throughout. SGLang itself cannot run here (no GPU), so the sglang backend launches
a stand-in at that boundary: a small script invoked exactly as `python -m sglang.launch_server
ARGS...` would be, which forks a child (as SGLang's scheduler processes are), prints a log,
prints its argv (API key included, as SGLang prints its ServerArgs) and serves /health_generate
and /server_info on the --port it was given. What is tested is qverify's side of that boundary.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from qverify.errors import BadInput, InfraError
from qverify.models import BuildManifest
from qverify.serve import LaunchedServer, get_backend
from qverify.serve.base import check_port_free
from qverify.serve.profile import parse_profile

REPO = Path(__file__).resolve().parents[2]
KEY = "sk-lifecycle-secret-42"

TREE = textwrap.dedent("""
    import os, signal, subprocess, sys, time
    out = sys.argv[1]
    kids = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]),
            # ignores SIGTERM: only the group-wide SIGKILL ends it
            subprocess.Popen([sys.executable, "-c",
                              "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"]),
            # a grandchild behind a shell
            subprocess.Popen(["sh", "-c", "sleep 600 & echo $! > " + out + ".gc; wait"])]
    pid = os.fork()
    if pid == 0:
        time.sleep(600)
        os._exit(0)
    while not os.path.exists(out + ".gc") or not open(out + ".gc").read().strip():
        time.sleep(0.05)
    pids = [os.getpid(), pid, int(open(out + ".gc").read())] + [k.pid for k in kids]
    open(out + ".tmp", "w").write(" ".join(map(str, pids)))
    os.rename(out + ".tmp", out)
    print("tree up", flush=True)
    if len(sys.argv) > 2:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(600)
""")

STAND_IN = textwrap.dedent("""
    import argparse, json, os, subprocess, sys, threading, time
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    ap = argparse.ArgumentParser()
    for f in ("-m", "--host", "--api-key", "--served-model-name"):
        ap.add_argument(f)
    ap.add_argument("--port", type=int)
    a, _ = ap.parse_known_args()
    print("server_args=" + " ".join(sys.argv[1:]), flush=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    if os.environ.get("FAKE_PIDFILE"):
        open(os.environ["FAKE_PIDFILE"], "w").write(f"{os.getpid()} {child.pid}")
    for i in range(60):
        print(f"loading line {i}", flush=True)
    mode = os.environ.get("FAKE_MODE", "serve")
    if mode == "exit":
        sys.exit(3)
    if mode == "never":
        time.sleep(600)

    class H(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            if a.api_key and self.headers.get("Authorization") != f"Bearer {a.api_key}":
                return self._send(401, {"error": "bad key"})
            if self.path == "/health_generate":
                return self._send(200, {})
            if self.path == "/server_info":
                return self._send(200, {"launch_command": "python -m sglang.launch_server --api-key <redacted>",
                                        "api_key": a.api_key, "max_total_num_tokens": 4096, "kv_cache_dtype": "fp8_e4m3",
                                        "unrelated_knob": 7, "internal_states": [{"avg_spec_accept_length": 2.5}]})
            self._send(404, {})

        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    if float(os.environ.get("FAKE_DIE_AFTER", 0)):
        threading.Timer(float(os.environ["FAKE_DIE_AFTER"]), lambda: os._exit(5)).start()
    ThreadingHTTPServer((a.host, a.port), H).serve_forever()
""")


def survivors(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still alive (zombies awaiting their reaper count as gone) after waiting up to `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.1)


def wait_file(path: Path, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)
    return path.read_text()


@pytest.mark.parametrize("leader_ignores_term", [False, True], ids=["term", "leader-ignores-term"])
def test_stop_ends_the_whole_process_group(tmp_path, leader_ignores_term):
    script = tmp_path / "tree.py"
    script.write_text(TREE)
    pidfile = tmp_path / "pids"
    cmd = [sys.executable, str(script), str(pidfile)] + (["ignore"] if leader_ignores_term else [])
    server = LaunchedServer(cmd, tmp_path / "logs" / "tree.log")
    server.start()
    try:
        pids = [int(p) for p in wait_file(pidfile).split()]
        assert len(pids) == 6 and survivors(pids, timeout=0) == pids  # all up before the stop
    finally:
        server.stop(grace_s=1.0)
    assert survivors(pids) == [], "orphans survived stop()"
    assert "tree up" in (tmp_path / "logs" / "tree.log").read_text()
    server.stop()  # idempotent


@pytest.fixture
def stand_in(tmp_path: Path) -> Path:
    """An executable that takes `-m sglang.launch_server ARGS` and runs the stand-in server."""
    (tmp_path / "stand_in.py").write_text(STAND_IN)
    exe = tmp_path / "python-sglang"
    # `-c 'import sglang'` is the launch's import check: the stand-in answers it as an interpreter with sglang does
    exe.write_text(f'#!/bin/sh\n[ "$1" = "-c" ] && exit 0\nexec "{sys.executable}" "{tmp_path / "stand_in.py"}" "$@"\n')
    exe.chmod(0o755)
    return exe


def make_build(root: Path) -> Path:
    d = root / "builds" / "b-life"
    d.mkdir(parents=True)
    m = BuildManifest(build_id="b-life", recipe="fp8kv", recipe_hash="h", recipe_text="", source_model="t",
                      source_hash="s", serving={"kv_cache_dtype": "fp8_e4m3", "weight_quantization": "compressed-tensors"})
    (d / "build.json").write_text(m.model_dump_json())
    return d


def sglang_backend(tmp_path: Path, stand_in: Path, port: int | None = None):
    prof = parse_profile(f"backend: sglang\napi_key_env: QV_TEST_KEY\nflags: {{python: '{stand_in}'}}")
    d = make_build(tmp_path)
    manifest = BuildManifest.model_validate_json((d / "build.json").read_text())
    return get_backend("sglang")(d, manifest, prof, tmp_path / "logs", port=port)


def test_sglang_backend_lifecycle_and_secrets(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    monkeypatch.setenv("FAKE_PIDFILE", str(tmp_path / "pids"))
    b = sglang_backend(tmp_path, stand_in)
    with b as ep:
        assert ep.base_url == f"http://127.0.0.1:{b.port}/v1" and ep.model == "b-life" and ep.api_key == KEY
        info = b.info()
        assert info["max_total_num_tokens"] == 4096 and info["avg_spec_accept_length"] == 2.5
        assert "unrelated_knob" not in info  # SGLang's info is cut to the fields results depend on
        assert b.alive()
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert survivors(pids) == []
    # the key reached the server, but no log, recorded command or captured info holds it
    logs = "".join(p.read_text() for p in (tmp_path / "logs").iterdir())
    assert "--api-key ***" in logs and KEY not in logs
    assert KEY not in json.dumps(b.command()) + json.dumps(info) + ep.model_dump_json()
    assert "${QV_TEST_KEY}" in b.command()


def test_never_ready_fails_with_the_log_tail(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    monkeypatch.setenv("FAKE_MODE", "never")
    monkeypatch.setenv("FAKE_PIDFILE", str(tmp_path / "pids"))
    b = sglang_backend(tmp_path, stand_in)
    b.start()
    with pytest.raises(InfraError) as e:
        b.wait_ready(timeout=3)
    msg = str(e.value)
    assert "not ready after 3s" in msg and "loading line 59" in msg and "loading line 10\n" in msg
    assert "loading line 9\n" not in msg  # the last 50 lines, not the whole log
    assert KEY not in msg and str(b.log_path) in e.value.fix
    b.stop()
    assert survivors([int(p) for p in (tmp_path / "pids").read_text().split()]) == []


def test_server_that_exits_is_reported(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("FAKE_MODE", "exit")
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    b = sglang_backend(tmp_path, stand_in)
    b.start()
    with pytest.raises(InfraError, match="exited with code 3") as e:
        b.wait_ready(timeout=30)
    assert "loading line 59" in str(e.value)
    b.stop()


def test_port_in_use_is_bad_input(tmp_path, stand_in, monkeypatch):
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(BadInput, match=f"port {port} is already in use"):
            check_port_free(port)
        b = sglang_backend(tmp_path, stand_in, port=port)
        with pytest.raises(BadInput, match="already in use"):
            b.start()
        assert not b.servers  # nothing was launched
        r = _cli(tmp_path, "serve", "b-life", "--profile", str(_profile_file(tmp_path, stand_in)), "--port", str(port),
                 env={"QV_TEST_KEY": KEY})
    assert r.returncode == 4 and "already in use" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def _cli(workdir: Path, *args: str, env: dict | None = None, **kw):
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(workdir), *args], capture_output=True, check=False,
                          text=True, cwd=REPO, timeout=120, env={**os.environ, **(env or {})}, **kw)


def _profile_file(tmp_path: Path, stand_in: Path) -> Path:
    p = tmp_path / "standin.yaml"
    p.write_text(f"backend: sglang\napi_key_env: QV_TEST_KEY\nflags: {{python: '{stand_in}'}}\n")
    return p


def test_cli_foreground_until_ctrl_c(tmp_path, stand_in):
    make_build(tmp_path)
    env = {**os.environ, "QV_TEST_KEY": KEY, "FAKE_PIDFILE": str(tmp_path / "pids")}
    proc = subprocess.Popen([sys.executable, "-m", "qverify", "--workdir", str(tmp_path), "serve", "b-life",
                             "--profile", str(_profile_file(tmp_path, stand_in))],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO, env=env)
    try:
        first = proc.stdout.readline()
        assert "serving b-life at http://127.0.0.1:" in first and "accept length 2.5" in first, first
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert survivors([int(p) for p in (tmp_path / "pids").read_text().split()]) == []
    assert KEY not in first + out + err


@pytest.mark.slow
def test_cli_reports_a_server_that_dies_mid_run(tmp_path, stand_in):
    make_build(tmp_path)
    r = _cli(tmp_path, "serve", "b-life", "--profile", str(_profile_file(tmp_path, stand_in)),
             env={"QV_TEST_KEY": KEY, "FAKE_DIE_AFTER": "4"})
    assert r.returncode == 3, r.stderr
    assert "stopped answering" in r.stderr and "loading line 59" in r.stderr


def test_sglang_interpreter_is_the_repositorys_venv_whatever_the_cwd(tmp_path, monkeypatch):
    from qverify.serve.sglang_flags import SGLANG_VENV_PYTHON, sglang_python

    monkeypatch.delenv("QVERIFY_SGLANG_PYTHON", raising=False)
    monkeypatch.chdir(tmp_path)
    assert sglang_python(None) == str(SGLANG_VENV_PYTHON) == str(REPO / ".venv-sglang" / "bin" / "python")
    assert sglang_python(None) != sys.executable  # never qverify's own interpreter (no sglang there)
    monkeypatch.setenv("QVERIFY_SGLANG_PYTHON", "/opt/sglang/bin/python")
    assert sglang_python(None) == "/opt/sglang/bin/python" and sglang_python("/x/python") == "/x/python"


@pytest.mark.parametrize("python", ["no-sglang", "missing"])
def test_an_interpreter_without_sglang_is_refused_before_launch(tmp_path, monkeypatch, python):
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    exe = tmp_path / "python-plain"
    if python == "no-sglang":  # what a Python without sglang prints for `-c 'import sglang'`
        exe.write_text("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'sglang'\" >&2\nexit 1\n")
        exe.chmod(0o755)
    b = sglang_backend(tmp_path, exe)
    with pytest.raises(BadInput) as e:
        b.start()
    assert not b.servers and e.value.exit_code == 4 and "setup_sglang.sh" in e.value.fix
    assert ("No module named 'sglang'" if python == "no-sglang" else "cannot run") in str(e.value)


def test_readiness_timeout_comes_from_the_profile(tmp_path, stand_in, monkeypatch):
    from qverify.serve.sglang_flags import SGLangFlags

    assert SGLangFlags().ready_timeout_s >= 3600  # a cold 1T start: ~590 GB of weights, graphs, autotuning
    monkeypatch.setenv("QV_TEST_KEY", KEY)
    monkeypatch.setenv("FAKE_MODE", "never")
    prof = parse_profile(f"backend: sglang\napi_key_env: QV_TEST_KEY\nflags: {{python: '{stand_in}', ready_timeout_s: 2}}")
    d = make_build(tmp_path)
    b = get_backend("sglang")(d, BuildManifest.model_validate_json((d / "build.json").read_text()), prof, tmp_path / "logs")
    b.start()
    try:
        with pytest.raises(InfraError, match="not ready after 2s"):
            b.wait_ready()
    finally:
        b.stop()


def test_a_build_with_an_sglang_visible_mla_scale_is_refused_before_launch(tmp_path, stand_in, monkeypatch):
    import torch
    from safetensors.torch import save_file

    monkeypatch.setenv("QV_TEST_KEY", KEY)
    b = sglang_backend(tmp_path, stand_in)
    save_file({"model.layers.0.self_attn.k_proj.k_scale": torch.tensor(0.0113)}, b.build_dir / "kv.safetensors")
    with pytest.raises(BadInput, match=r"\(trtllm_mla\) multiplies every decode attention logit") as e:
        b.start()
    assert not b.servers and e.value.exit_code == 4
