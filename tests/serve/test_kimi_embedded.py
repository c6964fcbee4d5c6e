"""The embedded server serves builds of the Kimi-shaped checkpoint (INT4 routed experts through the linearized loader,
remote-code tokenizer), and `qverify gate` reaches a verdict on them. Random weights: the verdict itself is not
checked, only that the whole path runs and reports one of PASS / FAIL / INCONCLUSIVE with its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from qverify.models import ServingProfile

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("recipe", ["as_shipped", "fp8kv_nvfp4shared"])
def test_embedded_server_serves_kimi_build(kimi_shaped, tmp_path, recipe):
    from qverify.quantize import build
    from qverify.serve.local import LocalBackend

    res = build(recipe, model=kimi_shaped, workdir=tmp_path / "wd", trust_remote_code=True, calib_samples=8, calib_seq_len=64)
    backend = LocalBackend(res.build_dir, res.manifest, ServingProfile(flags={"speculative": False}), tmp_path / "logs",
                           trust_remote_code=True)
    with backend as ep:
        tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}
        r = httpx.post(f"{ep.base_url}/chat/completions", timeout=120, headers=backend.headers, json={
            "model": ep.model, "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [tool],
            "max_tokens": 8, "temperature": 0, "chat_template_kwargs": {"thinking": False}})
        assert r.status_code == 200, r.text[:1000]
        choice = r.json()["choices"][0]
        assert choice["finish_reason"] in ("stop", "length", "tool_calls") and r.json()["usage"]["completion_tokens"] > 0


@pytest.mark.timeout(1500)
def test_gate_on_kimi_shaped_gives_a_verdict(kimi_shaped, tmp_path):
    (tmp_path / "qverify.toml").write_text(
        f'model = "{kimi_shaped}"\ntrust_remote_code = true\nbaseline = "as_shipped"\n'
        'suites = ["toolcall", "kld"]\nreplicates = 2\nlimit = 4\nreport = false\ncalib_samples = 8\ncalib_seq_len = 64\n')
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "gate",
                        "--recipe", "fp8kv_nvfp4shared", "--json", "--budget", "128"],  # 4 looks, as before the 12-look default
                       cwd=tmp_path, capture_output=True, text=True, timeout=1400, env=env, check=False)
    assert r.returncode in (0, 1, 2), r.stderr[-3000:]
    assert r.stdout.strip(), f"exit {r.returncode} with no report; stderr: {r.stderr[-3000:]}"
    report = json.loads(r.stdout)
    assert report["verdict"] == ["PASS", "FAIL", "INCONCLUSIVE"][r.returncode]
    assert report["baseline_recipe"] == "as_shipped" and report["candidates"][0]["recipe"] == "fp8kv_nvfp4shared"
