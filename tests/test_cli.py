"""The CLI root: every command listed, version, bad input → one line and exit 4, config validation."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qverify.cli import main

COMMANDS = ["recipes", "build", "builds", "verify-build", "serve", "suites", "eval", "gate", "report", "capacity"]


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "qverify", *args], capture_output=True, text=True, cwd=cwd, timeout=120)


def test_help_lists_every_command():
    r = run("--help")
    assert r.returncode == 0
    for c in COMMANDS:
        assert f"  {c} " in r.stdout, c


def test_version():
    from qverify import __version__

    r = run("--version")
    assert r.returncode == 0 and __version__ in r.stdout


@pytest.mark.parametrize("argv", [["frobnicate"], ["--bogus"], ["eval"], ["suites", "show", "tolcall"],
                                  ["eval", "nope", "--replicates", "zero"]])
def test_bad_input_is_one_line_and_exit_4(argv):
    r = run(*argv)
    assert r.returncode == 4, r.stderr
    lines = [ln for ln in r.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), r.stderr


def test_did_you_mean():
    r = run("suites", "show", "tolcall")
    assert "did you mean 'toolcall'" in r.stderr


def test_unknown_config_key_names_the_key(tmp_path):
    (tmp_path / "qverify.toml").write_text('replicates = 3\nreplicatess = 4\n')
    r = run("--workdir", str(tmp_path / "wd"), "gate", cwd=tmp_path)
    assert r.returncode == 4 and "replicatess" in r.stderr


def test_malformed_config(tmp_path):
    (tmp_path / "q.toml").write_text('replicates = [\n')
    r = run("gate", "--config", str(tmp_path / "q.toml"), cwd=tmp_path)
    assert r.returncode == 4 and "malformed TOML" in r.stderr


def test_nested_unknown_key(tmp_path):
    (tmp_path / "q.toml").write_text('[serving]\nbackend = "local"\nconcurency = 4\n')
    r = run("gate", "--config", str(tmp_path / "q.toml"), cwd=tmp_path)
    assert r.returncode == 4 and "serving.concurency" in r.stderr


def test_main_returns_codes_in_process():
    assert main(["--bogus"]) == 4
    assert main(["--version"]) == 0


def test_suites_list_json():
    import json

    r = run("--json", "suites", "list")
    assert r.returncode == 0
    names = {s["name"] for s in json.loads(r.stdout)}
    assert {"coding", "toolcall", "longctx", "verifier", "kld"} <= names


def test_unexpected_error_is_infrastructure_exit_3_not_fail(monkeypatch, capsys):
    """Python's own exit status for an uncaught exception is 1, which qverify reserves for a FAIL verdict."""
    import qverify.quantize.recipe as recipe
    from qverify.cli import main

    def boom():
        raise RuntimeError("disk vanished")

    monkeypatch.setattr(recipe, "list_recipes", boom)
    assert main(["recipes"]) == 3
    assert "unexpected RuntimeError: disk vanished" in capsys.readouterr().err
