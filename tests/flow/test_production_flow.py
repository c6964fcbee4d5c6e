"""docs/serve.md's production block, run as written (issue 36.1/36.3): every `qverify` line of it, in order, read
from the page itself so the page cannot go stale, on a Kimi-shaped `kimi_k25` fixture.

What stands in for the GPU: the launch is checked by its `--dry-run`, and SGLang's server is one embedded server
per build (each serving the wrapper build's text model, issue 40.3) behind a model router on 127.0.0.1, attached
through qverify.toml's `[serving] backend = "endpoint"` as the page says a cluster does, with the page's own
`profile = "kimi-k2.6"` (its model settings apply to an endpoint, issue 40.2). The test's only other changes to
the block: the fixture's path for /models/kimi-k2.6, a small calibration, and the suite sizes of a CPU run.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.fixtures.kimi_k25 import kimi_k25  # noqa: F401 - the session fixture
from tests.flow.router import ModelRouter

ROOT = Path(__file__).resolve().parents[2]
SECTION = "### Production: Kimi K2.6 on SGLang"
MODEL = "/models/kimi-k2.6"
TEST_SIZES = {"suites": ["kld"], "limit": 4, "replicates": 2, "calib_samples": 8, "calib_seq_len": 64}


def production_block() -> tuple[str, list[list[str]]]:
    """(the qverify.toml the block writes, each `qverify` line as argv) from docs/serve.md's production section."""
    section = (ROOT / "docs" / "serve.md").read_text().split(SECTION, 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, re.DOTALL)[1].splitlines()
    toml, lines, heredoc = [], [], None
    for line in block:
        if heredoc is not None:
            if line.strip() == heredoc:
                heredoc = None
            else:
                toml.append(line)
        elif m := re.match(r"cat > qverify\.toml <<'?(\w+)'?", line):
            heredoc = m[1]
        elif line.startswith("qverify "):
            lines.append(shlex.split(line, comments=True))
    return "\n".join(toml) + "\n", lines


def test_the_block_is_the_whole_flow():
    """What the page promises a user: trust granted once where it starts, both builds, the checks, the gate, report."""
    toml, lines = production_block()
    cfg = tomllib.loads(toml)
    assert cfg["trust_remote_code"] is True and cfg["serving"]["profile"] == "kimi-k2.6"
    subcommands = [argv[1] for argv in lines]
    assert subcommands == ["build", "build", "verify-build", "serve", "capacity", "gate", "report"]
    assert not any(a == "eval" for a in subcommands)  # the gate evaluates what is missing itself (issue 36.1)


def _qverify(wd: Path, cwd: Path, argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd), *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1500, check=False)


def _as_configured_here(toml: str, model: Path, router_url: str) -> str:
    """The page's qverify.toml with the fixture, CPU-sized suites, and [serving] pointed at the router (the page's
    cluster variant: backend "endpoint", the same profile)."""
    sizes = "".join(f"{k} = {json.dumps(v)}\n" for k, v in TEST_SIZES.items())
    text = sizes + toml.replace(MODEL, str(model))
    assert 'backend = "sglang"' in text
    text = text.replace('backend = "sglang"', f'backend = "endpoint"\nendpoint = "{router_url}"')
    cfg = tomllib.loads(text)
    assert cfg["serving"]["profile"] == "kimi-k2.6" and cfg["trust_remote_code"] is True
    return text


def _as_run_here(argv: list[str], model: Path) -> list[str]:
    argv = [str(model) if a == MODEL else a for a in argv]
    if argv[1] == "build":  # a small calibration: the build path, not its statistics, is under test
        argv += ["--calib-samples", str(TEST_SIZES["calib_samples"]), "--calib-seq-len", str(TEST_SIZES["calib_seq_len"])]
    return argv


@pytest.mark.slow  # about 4-5 min on 2 cores: two builds, two servers, a gate, MLflow
@pytest.mark.timeout(3000)
def test_every_line_of_the_production_block_runs_in_order(kimi_k25, tmp_path):  # noqa: F811
    from qverify.models import ServingProfile
    from qverify.serve.local import LocalBackend
    from qverify.workdir import Workdir

    toml, lines = production_block()
    wd = tmp_path / "wd"
    upstreams: dict[str, tuple[str, str]] = {}
    with ModelRouter(upstreams) as router:
        (tmp_path / "qverify.toml").write_text(_as_configured_here(toml, kimi_k25, router.url))
        env = os.environ | {"PYTHONPATH": str(ROOT), "QVERIFY_API_KEY": router.key}
        results = {}
        with_servers = []
        try:
            for argv in lines:
                if argv[1] == "gate":  # SGLang's servers, one per build, behind the router
                    for ref in ("as_shipped", "fp8kv_nvfp4shared"):
                        build_dir, manifest = Workdir.at(wd).resolve_build(ref)
                        srv = LocalBackend(build_dir, manifest, ServingProfile(), tmp_path / "logs", trust_remote_code=True)
                        ep = srv.__enter__()
                        with_servers.append(srv)
                        upstreams[ep.model] = (ep.base_url.removesuffix("/v1"), ep.api_key)
                r = _qverify(wd, tmp_path, _as_run_here(argv, kimi_k25), env)
                results[" ".join(argv[1:3])] = r
                print(f"$ {shlex.join(argv)}  -> exit {r.returncode}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")  # on failure
                assert r.returncode in ((0, 1, 2) if argv[1] == "gate" else (0,)), \
                    f"{shlex.join(argv)} exited {r.returncode}: {r.stderr[-3000:]}"
            dry = next(r for k, r in results.items() if k.startswith("serve"))
            assert "sglang.launch_server" in dry.stdout and "--port 30000" in dry.stdout  # the same command every time
            cap = next(r for k, r in results.items() if k.startswith("capacity"))
            assert "KV tokens per replica" in cap.stdout
            assert upstreams and all(router.hits[m] > 0 for m in upstreams)  # the gate evaluated both builds itself
            assert "fp8kv_nvfp4shared" in results["report --compare"].stdout
            _the_runs_record_what_was_sent(wd, tmp_path, env, kimi_k25)
            _how_to_reproduce_runs(wd, tmp_path, env)
        finally:
            for srv in with_servers:
                srv.__exit__(None, None, None)


def _the_runs_record_what_was_sent(wd: Path, cwd: Path, env: dict[str, str], model: Path) -> None:
    """The gate's runs went through the endpoint with the kimi-k2.6 profile's model settings; an eval of toolcall
    records the profile's output budget (512), the one its requests carried (issue 40.4; before: toolcall's 96)."""
    from qverify.evals.store import RunStore
    from qverify.workdir import Workdir

    w = Workdir.at(wd)
    cand = w.resolve_build_id("fp8kv_nvfp4shared")
    kld = RunStore(w.run_dir(cand, "kld")).read_manifest()
    assert kld.serving.backend == "endpoint" and kld.serving.chat_template_kwargs == {"thinking": False}
    assert kld.served_model == cand and kld.sampling.max_tokens == 1
    r = _qverify(wd, cwd, ["qverify", "eval", "fp8kv_nvfp4shared", "--suites", "toolcall", "--limit", "1",
                           "--replicates", "1"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    store = RunStore(w.run_dir(cand, "toolcall"))
    sent = store.results(store.replicates()[0])[0].response
    assert store.read_manifest().sampling.max_tokens == 512
    assert sent.usage.get("completion_tokens", 0) <= 512 and (sent.finish_reason != "length"
                                                               or sent.usage["completion_tokens"] == 512)
    assert json.loads(store.read_manifest().model_dump_json())["serving"]["name"] == "kimi-k2.6"


def _how_to_reproduce_runs(wd: Path, cwd: Path, env: dict[str, str]) -> None:
    """The review's "How to reproduce" block, generated from the manifests, run as printed (issue 40.4: its build line
    lacked --trust-remote-code, exit 4, and its eval lines the --limit and endpoint backend the runs used): each
    build line gives the expected build id, and each eval line finds the stored runs complete (a mismatched
    --limit, salt or sampling would be exit 4: "holds results for another item set")."""
    from qverify.reports.bundle import load_gate
    from qverify.reports.review import reproduce_commands
    from qverify.workdir import Workdir

    gate_id = Workdir.at(wd).gate_ids()[-1]
    commands = reproduce_commands(load_gate(wd, gate_id))
    builds = [c for c in commands if " build " in c]
    evals = [c for c in commands if " eval " in c]
    assert builds and evals and all("--trust-remote-code" in c for c in builds + evals)
    assert all("--backend endpoint" in c and "--profile kimi-k2.6" in c and "--limit " in c for c in evals)
    for line in builds + evals:
        command, _, expect = line.partition("   # expect build id ")
        argv = shlex.split(command)
        assert argv[:3] == ["qverify", "--workdir", str(wd.resolve())], line
        r = subprocess.run([sys.executable, "-m", *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
                           check=False)
        assert r.returncode == 0, f"{line}: exit {r.returncode}: {r.stderr[-2000:]}"
        if expect:
            assert expect.strip() in r.stdout + r.stderr, line
