"""The layout's rules, checked on the source (README, "Code map"): each can fail on a real regression.

- no import cycles among qverify modules (module-level and function-level imports alike), none when
  `if TYPE_CHECKING:` imports count too (a cycle hidden there is still a loop in the design), and none
  among packages (qverify.gate, qverify.serve, ... and the top-level modules);
- layers point down: no qverify.gate module imports the pipeline, a server or the quantizer (gate/ is
  statistics and the verdict; orchestration is qverify/rounds.py and qverify/pipeline.py), and
  qverify/config.py imports no gate module;
- build.json is parsed in one module (qverify/workdir.py);
- a suite's gate metrics are declared in its own file (adding a suite touches that file plus
  its registration in qverify/suites/__init__.py);
- module sizes: median <= 150 lines, p90 <= 300, none over 400.
"""

from __future__ import annotations

import ast
import statistics
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "qverify"


def _modules() -> dict[str, Path]:
    out = {}
    for p in sorted(PKG.rglob("*.py")):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = p
    return out


def _imports(tree: ast.AST, module: str, is_pkg: bool, known: dict[str, Path], type_checking: bool = False) -> set[str]:
    """qverify modules imported anywhere in `tree` (an import of a name from a package counts as the
    package, of a submodule as the submodule); `if TYPE_CHECKING:` blocks count only with `type_checking`."""
    package = module if is_pkg else module.rpartition(".")[0]
    found: set[str] = set()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    def visit(node: ast.AST) -> None:
        if not type_checking and isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for child in node.orelse:
                visit(child)
            return
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for n in names:
            if n.split(".")[0] == "qverify" and (r := resolve(n)) and r != module:
                found.add(r)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(type_checking: bool = False) -> dict[str, set[str]]:
    mods = _modules()
    return {m: _imports(ast.parse(p.read_text()), m, p.name == "__init__.py", mods, type_checking) for m, p in mods.items()}


def _package(module: str) -> str:
    """qverify.gate.rule -> qverify.gate; qverify.config -> qverify.config (a top-level module is its own node)."""
    return ".".join(module.split(".")[:2])


def package_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for m, deps in graph.items():
        out.setdefault(_package(m), set()).update(_package(d) for d in deps if _package(d) != _package(m))
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    graph = import_graph()
    assert "qverify.gate.gate" in graph and graph["qverify.gate.gate"]  # the graph is really built
    assert cycles(graph) == []


def test_no_import_cycles_when_type_checking_imports_count():
    """A cycle that only an `if TYPE_CHECKING:` import hides is still two modules that need each other
    (reports: facts -> rows -> review -> facts, until the formatters moved to reports/formatting.py)."""
    assert cycles(import_graph(type_checking=True)) == []


def test_no_import_cycles_between_packages():
    """qverify.config -> qverify.gate -> qverify.config was one (parse_budget lived in gate/budget.py)."""
    graph = package_graph(import_graph(type_checking=True))
    assert "qverify.config" in graph.get("qverify.gate", set())  # the graph is really built
    assert cycles(graph) == []


def test_gate_imports_no_pipeline_serve_or_quantize():
    """gate/ is statistics and the verdict: it reads runs and build manifests, and never evaluates, serves or builds."""
    above = ("qverify.pipeline", "qverify.rounds", "qverify.serve", "qverify.quantize", "qverify.commands", "qverify.cli")
    graph = import_graph(type_checking=True)
    found = {m: sorted(d for d in deps if _package(d) in above) for m, deps in graph.items() if m.startswith("qverify.gate")}
    assert len(found) > 10 and {m: d for m, d in found.items() if d} == {}


def test_config_imports_no_gate():
    graph = import_graph(type_checking=True)
    assert {d for d in graph["qverify.config"] if _package(d) == "qverify.gate"} == set()


def _string_constants(path: Path) -> set[str]:
    """String literals in code (docstrings excluded)."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs}


def _path_parts(path: Path) -> set[str]:
    """String literals joined onto a path (`x / "runs"`, `x.joinpath("runs")`, `x.glob("*/gate.json")`)."""
    out: set[str] = set()
    for n in ast.walk(ast.parse(path.read_text())):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div):
            out |= {v.value for v in (n.left, n.right) if isinstance(v, ast.Constant) and isinstance(v.value, str)}
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("joinpath", "glob", "rglob"):
            for a in n.args:
                if isinstance(a, ast.Constant) and isinstance(a.value, str):
                    out |= {a.value, *a.value.split("/")}
    return out


def test_build_json_is_named_and_parsed_only_in_workdir():
    owners = []
    for mod, p in _modules().items():
        text = p.read_text()
        if "build.json" in _string_constants(p) or "BuildManifest.model_validate_json" in text:
            owners.append(mod)
    assert owners == ["qverify.workdir"]


def test_workdir_folder_names_are_spelled_only_in_workdir():
    names = {"builds", "runs", "gates", "logs", "mlflow.db", "mlartifacts", "gate.json", "build.json", "sequence.json"}
    spelled = {mod: sorted(names & _path_parts(p)) for mod, p in _modules().items()}
    # reports/artifacts.py stages the MLflow artifact tree, whose folders are named after the workdir's
    spelled = {m: v for m, v in spelled.items() if v and m not in ("qverify.workdir", "qverify.reports.artifacts")}
    assert spelled == {}


def test_each_suite_declares_its_gate_metrics_in_its_own_file():
    from qverify.suites import suites

    for name, cls in suites.items():
        for spec in cls.gate_metrics:
            assert spec.suite == name and spec.name.startswith(f"{name}/"), spec
    declared_in = {mod for mod, p in _modules().items() if "MetricSpec(" in p.read_text()}
    suite_files = {cls.__module__ for _, cls in suites.items() if cls.gate_metrics}
    assert declared_in - {"qverify.suites.metric_spec"} == suite_files


def test_a_suite_is_registered_in_one_place():
    """Adding a suite: its file, plus one import in qverify/suites/__init__.py (nothing in gate/ names a suite)."""
    from qverify.suites import suites

    init = (PKG / "suites" / "__init__.py").read_text()
    for name, cls in suites.items():
        assert cls.__module__.rpartition(".")[2] in init
    for p in (PKG / "gate").glob("*.py"):
        consts = _string_constants(p)
        assert not any(c.startswith(f"{s}/") for c in consts for s in suites.names()), p
    suite_modules = {cls.__module__ for _, cls in suites.items()}
    graph = import_graph()
    assert {m: graph[m] & suite_modules for m in graph if m.startswith("qverify.gate")} == \
        {m: set() for m in graph if m.startswith("qverify.gate")}


def module_sizes() -> list[int]:
    return sorted(len(p.read_text().splitlines()) for p in _modules().values())


def test_module_sizes():
    sizes = module_sizes()
    p90 = statistics.quantiles(sizes, n=10)[8]
    assert statistics.median(sizes) <= 150 and p90 <= 300 and sizes[-1] <= 400, (statistics.median(sizes), p90, sizes[-5:])
