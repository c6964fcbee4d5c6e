"""The redactor: secrets out, ordinary figures (kv_bytes_per_token, max_tokens) untouched."""

from __future__ import annotations

import pytest

from qverify.reports import redact
from qverify.reports.redact import MASK, is_secret_key, redact_command, redact_obj, redact_text


@pytest.mark.parametrize("key", ["api_key", "API-KEY", "--api-key", "OPENAI_API_KEY", "HF_TOKEN", "token", "password",
                                 "tracker_password", "aws_secret_access_key", "Authorization", "github_token"])
def test_secret_keys(key):
    assert is_secret_key(key)


@pytest.mark.parametrize("key", ["kv_bytes_per_token", "max_tokens", "tokens_per_s", "top_logprobs", "kv-cache-dtype",
                                 "tokenizer", "n_tokens", "author"])
def test_ordinary_keys(key):
    assert not is_secret_key(key)


def test_values_and_assignments_are_masked():
    text = ("HF_TOKEN=hf_abcdefghijklmnopqrstuvwx1234 start --api-key sk-proj-abcdefghijklmnop1234 "
            "Authorization: Bearer abc.def.ghijklmnop url https://bob:hunter2pass@mlflow.internal/x "
            '{"password": "p4ssw0rd!", "kv_bytes_per_token": 3456, "max_tokens": 256}')
    out = redact_text(text)
    for leaked in ("hf_abcdefghijklmnopqrstuvwx1234", "sk-proj-abcdefghijklmnop1234", "abc.def.ghijklmnop", "hunter2pass", "p4ssw0rd!"):
        assert leaked not in out
    assert '"kv_bytes_per_token": 3456' in out and '"max_tokens": 256' in out
    assert "https://***:***@mlflow.internal/x" in out


def test_env_secret_values_are_masked_anywhere(monkeypatch):
    monkeypatch.setenv("MY_SERVICE_TOKEN", "zz-unnamed-value-42")
    redact.refresh()
    try:
        assert redact_text("the probe sent zz-unnamed-value-42 upstream") == f"the probe sent {MASK} upstream"
    finally:
        monkeypatch.delenv("MY_SERVICE_TOKEN")
        redact.refresh()


def test_objects_and_commands():
    obj = {"flags": {"api-key": "x" * 12, "tp": 4}, "cmd": ["--token=abcdef123"], "n": 3}
    assert redact_obj(obj) == {"flags": {"api-key": MASK, "tp": 4}, "cmd": ["--token=***"], "n": 3}
    cmd = ["python", "-m", "sglang.launch_server", "--api-key", "secretvalue1", "--api-key=secretvalue2", "--tp", "4"]
    assert redact_command(cmd) == ["python", "-m", "sglang.launch_server", "--api-key", MASK, f"--api-key={MASK}", "--tp", "4"]
