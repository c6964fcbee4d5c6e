"""The CLI's shared options (#38.5.5, #38.6): each declared once (qverify/commands/_common.py), with one help text;
`--json` before or after every command; `--profile`'s help lists every built-in profile."""

from __future__ import annotations

import ast
import json
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest
import typer

from qverify.cli import app, main

COMMANDS_DIR = Path(__file__).resolve().parents[1] / "qverify" / "commands"
NOT_YET: set[str] = set()


def _leaves(cmd=None, path=()) -> dict[tuple[str, ...], object]:
    cmd = cmd or typer.main.get_command(app)
    subs = getattr(cmd, "commands", None)
    if not subs:
        return {path: cmd}
    out = {}
    for name, sub in subs.items():
        out |= _leaves(sub, (*path, name))
    return out


def _declared_names() -> dict[str, int]:
    """How often each `--name` literal opens a typer.Option(...) call in qverify/commands/*.py."""
    count: dict[str, int] = defaultdict(int)
    for p in COMMANDS_DIR.glob("*.py"):
        if p.stem in NOT_YET:
            continue
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "Option":
                for a in node.args:
                    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("--"):
                        count[a.value] += 1
    return count


def test_each_shared_option_is_declared_once_with_one_help_text():
    helps: dict[str, dict[str, list[str]]] = defaultdict(lambda: defaultdict(list))
    for path, cmd in _leaves().items():
        if path[0] in NOT_YET:
            continue
        for p in cmd.params:
            for o in getattr(p, "opts", []):
                if o.startswith("--"):
                    helps[o][p.help or ""].append(" ".join(path))
    shared = {o: h for o, h in helps.items() if sum(len(c) for c in h.values()) > 1}
    assert {"--trust-remote-code", "--tracking-uri", "--profile", "--config", "--seed-salt"} <= set(shared)
    drifted = {o: dict(h) for o, h in shared.items() if len(h) > 1}
    assert not drifted, drifted
    declared = _declared_names()
    # an option several commands take is declared in exactly one typer.Option(...) (an implicit name counts as none)
    assert {o: declared.get(o, 0) for o in shared if declared.get(o, 0) != 1} == {}
    assert {o: n for o, n in declared.items() if n > 1} == {}


def test_profile_help_lists_every_built_in_profile():
    from qverify.serve.profile import builtin_profiles

    names = builtin_profiles().names()
    assert {"kimi-k2.6", "kimi-k2.6-thinking", "b200-tp4", "h200-tp1", "local"} <= set(names)
    for path, cmd in _leaves().items():
        for p in cmd.params:
            if "--profile" in getattr(p, "opts", []) and path[0] not in NOT_YET:
                assert all(n in p.help for n in names), (path, p.help)


def in_process(argv: list[str], capsys) -> subprocess.CompletedProcess:
    code = main(argv)
    out = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, out.out, out.err)


# one invocation of every command; those that need a build get one that does not exist (exit 4 after parsing)
EVERY_COMMAND = {("recipes",): [], ("builds",): [], ("suites", "list"): [], ("suites", "show"): ["coding", "--n", "1"],
                 ("build",): ["--recipe", "nosuchrecipe"], ("verify-build",): ["nosuch"],
                 ("serve",): ["nosuch", "--dry-run"], ("eval",): ["nosuch"],
                 ("gate",): ["--baseline", "nosuch", "--candidate", "nosuch2"], ("report",): ["--gate", "nosuch"],
                 ("capacity",): ["nosuch"]}


def test_every_command_is_listed_here():
    assert set(_leaves()) == set(EVERY_COMMAND)


@pytest.mark.parametrize("path", sorted(EVERY_COMMAND))
def test_json_works_before_or_after_every_command(path, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    wd = ["--workdir", str(tmp_path / "wd")]
    before = in_process([*wd, "--json", *path, *EVERY_COMMAND[path]], capsys)
    after = in_process([*wd, *path, *EVERY_COMMAND[path], "--json"], capsys)
    assert "no such option" not in after.stderr.lower(), after.stderr
    assert (after.returncode, after.stdout) == (before.returncode, before.stdout), after.stderr
    if after.returncode == 0:
        json.loads(after.stdout)  # one JSON document


def test_builds_on_an_empty_workdir_says_how_to_make_one(tmp_path, capsys):
    r = in_process(["--workdir", str(tmp_path / "wd"), "builds"], capsys)
    assert r.returncode == 0 and "qverify build --recipe NAME" in r.stdout, r.stdout
    assert all(len(ln) <= 80 for ln in r.stdout.splitlines()[1:])  # the first is the title, with the path
