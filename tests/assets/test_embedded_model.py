"""The committed reference model: loads offline through the server's loader and emits a parseable tool call."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from qverify.assets import EMBEDDED_MODEL

pytestmark = pytest.mark.skipif(not (EMBEDDED_MODEL / "config.json").exists(), reason="qverify-tiny not trained yet")


def test_loads_offline_and_emits_a_parseable_tool_call(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from qverify.chatfmt import parse_tool_calls
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.suites.toolcall import generate_toolcall_items

    lm = load_for_serving(EMBEDDED_MODEL, speculative=False)
    assert lm.model.config.model_type == "deepseek_v3"
    assert lm.model.config.kv_lora_rank == 512 and lm.model.config.qk_rope_head_dim == 64
    item = next(i for i in generate_toolcall_items("toolcall", "test", 20, 0) if i.target["calls"])
    prompt = lm.tokenizer.apply_chat_template(item.messages, tools=item.tools, tokenize=False, add_generation_prompt=True)
    ids = lm.tokenizer(prompt, add_special_tokens=False)["input_ids"]
    out = Engine(lm.model, lm.tokenizer).generate([GenRequest(prompt_ids=ids, max_tokens=96)])[0]
    parsed = parse_tool_calls(out.text)
    assert parsed.tool_calls and not parsed.malformed, out.text
    offered = {t["function"]["name"] for t in item.tools}
    assert parsed.tool_calls[0]["name"] in offered
    json.loads(parsed.tool_calls[0]["arguments"])


def test_drafter_is_committed_next_to_the_target():
    assert (EMBEDDED_MODEL / "drafter" / "config.json").exists()
    card = (EMBEDDED_MODEL / "README.md").read_text()
    assert "Scores on the test split" in card and "Speculative decoding" in card


@pytest.mark.slow
def test_training_script_smoke(tmp_path):
    root = Path(__file__).resolve().parents[2]
    r = subprocess.run([sys.executable, str(root / "scripts/train_reference_model.py"), "--smoke", "--threads", "1",
                        "--out", str(tmp_path / "out"), "--work", str(tmp_path / "work")],
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "drafter" / "config.json").exists()
    assert json.loads((tmp_path / "out" / "training.json").read_text())["target"]["tokens"] > 0
