"""Behavioural identity of coding items: a normalized program and an input->output signature.

Two items are the same task when they compute the same thing, whatever the function and
variable names. The split key of a synthetic coding item is its signature, so items that
behave alike always share a split; `leaks` checks it independently on any two item sets
(both the normalized program and the signature), which is what the tests and the model
card rely on. Everything executed here is our own generated reference code, never model output.
"""

from __future__ import annotations

import ast
import builtins
import hashlib
from collections.abc import Callable, Iterable
from typing import Any

# Fixed probe inputs per argument kind: varied lengths, signs, repeats, and values at the
# generators' thresholds (2..5), so that near-identical programs get different signatures.
PROBES: dict[str, list[tuple]] = {
    "list": [([],), ([0],), ([5],), ([-3],), ([1, 2, 3, 4, 5, 6],), ([-4, -1, 0, 3, 3, 8],), ([7, 7, 2, 2, 2, 9],),
             ([10, -5, 6, -2, 12, 1, 4],), ([3, 1, 4, 1, 5, 9, 2, 6],), ([-9, 8, -7, 6, -5, 4],), ([2, 4, 4, 4, 3],),
             ([12, 10, 8, 5, 5],)],
    "str": [("",), ("a",), ("banana",), ("hello",), ("mississippi",), ("abcdefgh",), ("zzyzx",), ("queue",),
            ("kettle",), ("moonlight",), ("pizzazz",), ("rhythm",)],
}
_BUILTINS = set(dir(builtins))


def compile_function(code: str, name: str) -> Callable:
    ns: dict[str, Any] = {}
    exec(code, ns)  # noqa: S102 -- our own generated reference code, not model output
    return ns[name]


def outcome(fn: Callable, args: tuple) -> str:
    """repr of the result, or the exception type: both are behaviour."""
    try:
        return repr(fn(*[list(a) if isinstance(a, list) else a for a in args]))
    except Exception as e:  # noqa: BLE001 -- raising is part of what the program does
        return f"<{type(e).__name__}>"


def signature(code: str, name: str, kind: str) -> str:
    """Hash of the outputs on the fixed probes for the argument kind."""
    fn = compile_function(code, name)
    outs = [outcome(fn, args) for args in PROBES[kind]]
    return kind + ":" + hashlib.sha256("\n".join(outs).encode()).hexdigest()[:16]


class _Canonical(ast.NodeTransformer):
    """Function name -> f, arguments and locals -> v0, v1, ... in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[str, str] = {}

    def _rename(self, name: str) -> str:
        if name in _BUILTINS:
            return name
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        node.name = "f"
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            node.body = body[1:] or [ast.Pass()]  # a docstring is not behaviour
        self.generic_visit(node)
        return node

    def visit_arg(self, node: ast.arg) -> ast.AST:
        node.arg = self._rename(node.arg)
        return node

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self._rename(node.id)
        return node


def normalized_program(code: str) -> str:
    return ast.unparse(_Canonical().visit(ast.parse(code)))


def identity(item) -> tuple[str, str]:
    """(normalized program, signature) of a synthetic coding item."""
    t = item.target
    return normalized_program(t["code"]), signature(t["code"], t["entry_point"], t["arg_kind"])


def leaks(train: Iterable, held: Iterable) -> list[tuple[str, str]]:
    """Held-out items whose normalized program or signature occurs in `train`: (item id, which)."""
    programs, signatures = set(), set()
    for item in train:
        p, s = identity(item)
        programs.add(p)
        signatures.add(s)
    out = []
    for item in held:
        p, s = identity(item)
        if p in programs:
            out.append((item.id, "program"))
        elif s in signatures:
            out.append((item.id, "signature"))
    return out


def near_miss_tests(fn: Callable, neighbours: list[Callable], pool: list[tuple], first: int = 5,
                    cap: int = 10) -> list[tuple[tuple, object]]:
    """Hidden tests: the first `first` pool inputs, plus, for every neighbour program (one
    choice changed) that they do not tell apart from the reference, the first pool input that
    does, up to `cap` tests. A near-miss answer then fails whenever any pool input could show it."""
    chosen = list(pool[:first])
    for nb in neighbours:
        if len(chosen) >= cap:
            break
        if all(outcome(nb, a) == outcome(fn, a) for a in chosen):
            hit = next((a for a in pool[first:] if outcome(nb, a) != outcome(fn, a)), None)
            if hit is not None and hit not in chosen:
                chosen.append(hit)
    return [(a, fn(*[list(x) if isinstance(x, list) else x for x in a])) for a in chosen]
