"""A source whose config.json lies about its weights' shapes is bad input naming config.json (exit 4),
found before anything is built; honest sources (dense, Kimi-shaped compressed) pass the check."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from qverify.quantize.shapes import check_shapes


@pytest.mark.slow
def test_a_config_that_lies_about_shapes_exits_4_naming_config_json(tiny_model_dir, tmp_path):
    src = tmp_path / "model"
    shutil.copytree(tiny_model_dir, src)
    cfg = json.loads((src / "config.json").read_text())
    cfg["hidden_size"] = cfg["hidden_size"] + 32  # the weights stay as saved
    (src / "config.json").write_text(json.dumps(cfg))
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "build", "--recipe", "bf16",
                        "--model", str(src)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 4, r.stderr
    assert f"{src / 'config.json'} does not describe the weights" in r.stderr and "a bug" not in r.stderr, r.stderr
    assert not list((tmp_path / "wd" / "builds").glob("*")) if (tmp_path / "wd" / "builds").exists() else True


def test_honest_sources_pass_the_shape_check(tiny_model_dir, kimi_shaped):
    check_shapes(tiny_model_dir)
    check_shapes(tiny_model_dir / "drafter")
    check_shapes(kimi_shaped)  # compressed experts (weight_packed) are not the config's to describe
