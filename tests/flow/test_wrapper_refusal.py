"""A multimodal wrapper the embedded server cannot serve is one line and exit 4, naming what would serve it (issue
40.3: before, every wrapper build exited 3 with the server's traceback in a log). Wrapper builds it can serve (a
kimi_k25 build's text model) are served in tests/flow/test_production_flow.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests import synth

ROOT = Path(__file__).resolve().parents[2]


def test_a_wrapper_around_another_text_model_is_one_line_exit_4(tmp_path):
    d = synth.write_build(tmp_path / "wd" / "builds", "wrapped", recipe="bf16")
    (d / "config.json").write_text(json.dumps({"model_type": "llava", "architectures": ["LlavaForConditionalGeneration"],
                                               "text_config": {"model_type": "llama"}, "vision_config": {}}))
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "serve", "wrapped"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT, check=False)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 4 and len(lines) == 1, r.stderr
    assert "'llama' text model" in lines[0] and "--backend sglang" in lines[0] and "Traceback" not in r.stderr
