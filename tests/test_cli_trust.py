"""One way to grant remote-code trust (#40.1): `--trust-remote-code`, or `trust_remote_code = true` in qverify.toml,
accepted by every command that takes a build; the refusal names both."""

from __future__ import annotations

import subprocess

import pytest
import torch
from safetensors.torch import save_file

from qverify.cli import main
from qverify.models import BuildManifest

FLAG = "--trust-remote-code"
BOTH = ("--trust-remote-code", "trust_remote_code = true in qverify.toml")


def in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    code = main(argv)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


# each command that takes a build, with a build that does not exist: the error is about the build, not the flag
COMMANDS = [["build", "--recipe", "bf16", "--model", "/nonexistent/model"], ["verify-build", "nosuchbuild"],
            ["serve", "nosuchbuild", "--dry-run"], ["eval", "nosuchbuild"],
            ["gate", "--baseline", "nosuchbuild", "--candidate", "nosuchbuild2"], ["report", "--gate", "nosuchgate"],
            ["capacity", "nosuchbuild"]]


@pytest.mark.parametrize("argv", COMMANDS)
def test_every_command_that_takes_a_build_accepts_the_trust_flag(argv, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    r = in_process(["--workdir", str(tmp_path / "wd"), *argv, FLAG], capsys)
    assert r.returncode == 4, r.stderr
    assert "no such option" not in r.stderr.lower() and FLAG not in r.stderr, r.stderr


@pytest.fixture
def needs_code(tmp_path, monkeypatch):
    """A build whose build.json says it loads its own code (as a Kimi build does)."""
    wd = tmp_path / "wd"
    d = wd / "builds" / "kimiish"
    d.mkdir(parents=True)
    bm = BuildManifest(build_id="kimiish", recipe="bf16", recipe_hash="r", recipe_text="", source_model="synthetic",
                       source_hash="s", tensor_hashes={}, trust_remote_code=True)
    (d / "build.json").write_text(bm.model_dump_json(indent=2))
    monkeypatch.chdir(tmp_path)
    return wd


def test_the_refusal_names_both_ways_and_each_way_grants_trust(needs_code, tmp_path, capsys):
    argv = ["--workdir", str(needs_code), "serve", "kimiish", "--dry-run"]
    refused = in_process(argv, capsys)
    assert refused.returncode == 4 and all(w in refused.stderr for w in BOTH), refused.stderr
    # one line a terminal shows whole (issue 40.6: it ran to about 270 characters)
    assert len(refused.stderr.strip()) <= 180 and "\n" not in refused.stderr.strip(), refused.stderr
    flag = in_process([*argv, FLAG], capsys)
    assert flag.returncode == 0 and FLAG in flag.stdout, flag.stderr
    (tmp_path / "qverify.toml").write_text("trust_remote_code = true\n")
    config = in_process(argv, capsys)
    assert config.returncode == 0 and FLAG in config.stdout, config.stderr


@pytest.mark.parametrize("argv", [["verify-build", "kimiish"], ["build", "--recipe", "bf16", "--model", "MODEL"]])
def test_qverify_toml_grants_trust_to_verify_build_and_build(argv, needs_code, tmp_path, capsys):
    """build took only the flag; with qverify.toml's key the refusal is gone (what fails next is the fake model)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}')
    (model / "tokenizer_config.json").write_text("{}")
    save_file({"w": torch.zeros(2)}, str(model / "model.safetensors"))
    argv = ["--workdir", str(needs_code), *[str(model) if a == "MODEL" else a for a in argv]]
    refused = in_process(argv, capsys)
    assert refused.returncode == 4 and all(w in refused.stderr for w in BOTH), refused.stderr
    line = refused.stderr.strip().splitlines()[-1].replace(str(model), "MODEL")
    assert line.startswith("error: ") and len(line) <= 180, refused.stderr
    (tmp_path / "qverify.toml").write_text("trust_remote_code = true\n")
    granted = in_process(argv, capsys)
    assert "trust_remote_code" not in granted.stderr and FLAG not in granted.stderr, granted.stderr
