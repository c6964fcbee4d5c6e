"""One rule for input, in one place (#38.5, #37): qverify.strict's base refuses unknown keys, nan/inf anywhere and a
boolean where a number belongs; recipes' num_bits are checked at load; qverify.toml typos get "did you mean".
Each case is exit 4 with one line and its fix, through the CLI's main()."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from qverify.cli import main
from qverify.quantize.recipe import RECIPES_DIR

PKG = Path(__file__).resolve().parents[1] / "qverify"


def in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    code = main(argv)
    return subprocess.CompletedProcess(argv, code, "", capsys.readouterr().err)


def one_line(r) -> str:
    lines = [ln for ln in r.stderr.splitlines() if ln.strip() and not ln.startswith("  ")]
    assert len(lines) == 1 and lines[0].startswith("error:") and "fix:" in lines[0], r.stderr
    return lines[0]


FP8KV = (RECIPES_DIR / "fp8kv.yaml").read_text()


@pytest.mark.parametrize("edit, says", [
    (("num_bits: 8", "num_bits: .inf"), "nan and inf are not allowed"),
    (("dynamic: false", "dynamic: false\n          extra_arg: .nan"), "nan and inf are not allowed"),
    (("num_bits: 8", "num_bits: 99999999999999999999"), "num_bits: must be 8"),  # was "a bug in qverify", exit 3
    (("num_bits: 8", "num_bits: true"), "num_bits"),
    (("num_bits: 8", "num_bits: 4"), "num_bits: must be 8"),  # llm-compressor: "Only num_bits in (8)"
])
def test_a_recipe_with_nan_inf_or_impossible_bits_is_bad_input(edit, says, tmp_path, capsys):
    assert edit[0] in FP8KV
    recipe = tmp_path / "r.yaml"
    recipe.write_text(FP8KV.replace("name: fp8kv", "name: r").replace(*edit))
    r = in_process(["--workdir", str(tmp_path / "wd"), "build", "--recipe", str(recipe)], capsys)
    assert r.returncode == 4, r.stderr
    line = one_line(r)
    assert says in line and "Value error" not in line and str(recipe) in line


def test_huge_weight_bits_in_a_config_group_are_bad_input(tmp_path, capsys):
    text = (RECIPES_DIR / "nvfp4shared.yaml").read_text()
    assert "scheme: NVFP4" in text
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text.replace("name: nvfp4shared", "name: r").replace("scheme: NVFP4", (
        "config_groups: {g: {targets: [Linear], weights: {num_bits: 1000000, type: int, strategy: channel}}}")))
    r = in_process(["--workdir", str(tmp_path / "wd"), "build", "--recipe", str(recipe)], capsys)
    assert r.returncode == 4 and "from 1 to 16" in one_line(r), r.stderr


@pytest.mark.parametrize("toml, says", [
    ("replicates = true", "replicates: a whole number is needed, not a boolean"),
    ("limit = true", "limit: a whole number is needed, not a boolean"),
    ("[serving]\nport = true", "serving.port: a whole number is needed"),
    ("calib_samples = 0", "calib_samples"),  # was a silent fallback to the recipe's default
    ("calib_seq_len = 0", "calib_seq_len"),
    ("[thresholds.'coding/pass@1']\ntolerance = inf", "thresholds.coding/pass@1.tolerance: nan and inf"),
    ('[suite_options."lmeval:x"]\nweight = nan', "suite_options: nan and inf are not allowed (at lmeval:x.weight)"),
    ("replicats = 3", "unknown key 'replicats'; did you mean 'replicates'?"),
    ("[serving]\nbakend = 'local'", "unknown key 'serving.bakend'; did you mean 'backend'?"),
    ("[thresholds.'coding/pass@1']\ntolerence = 0.1", "did you mean 'tolerance'?"),
])
def test_qverify_toml_booleans_zero_counts_nan_and_typos_are_bad_input(toml, says, tmp_path, monkeypatch, capsys):
    (tmp_path / "qverify.toml").write_text(toml + "\n")
    monkeypatch.chdir(tmp_path)
    r = in_process(["--workdir", str(tmp_path / "wd"), "eval", "nosuchbuild"], capsys)
    assert r.returncode == 4, r.stderr
    assert says in one_line(r)


def test_records_keep_nan_measurements():
    """Results and gate reports are qverify's own measurements: a mean of no items is nan, and is kept."""
    import math

    from qverify.models import ItemResult

    r = ItemResult(item_id="i", suite="kld", replicate=0, seed=0, request_hash="h", scores={"kl": math.inf})
    assert r.scores["kl"] == math.inf


def _files_with(text: str) -> set[str]:
    return {str(p.relative_to(PKG.parent)) for p in PKG.rglob("*.py") if text in p.read_text()}


def test_one_strict_base():
    """Every pydantic model with extra="forbid" gets it from qverify.strict (one rule for nan/inf and booleans)."""
    assert _files_with('ConfigDict(extra="forbid"') == {"qverify/strict.py"}


def test_the_safetensors_header_is_parsed_in_one_place():
    """The 8-byte length prefix is read by quantize/manifest.py's read_safetensors_header only (capacity too)."""
    readers = _files_with('struct.unpack("<Q"') | _files_with("seek(8)") | _files_with("read(8)")
    assert readers == {"qverify/quantize/manifest.py"}
