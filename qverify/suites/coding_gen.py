"""Synthetic coding items: literal natural-language specs of small Python functions.

Specs are literal ("returns x * 3 + y") so a tiny model can learn them by copying;
difficulty grows with the number of operations, conditionals, loops and strings.
Expected values for the hidden tests come from running our own reference code
here, at generation time (trusted code, never model output).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

VERBS = ["scale", "shift", "mix", "clip", "blend", "fold", "merge", "tally", "pick", "boost", "trim", "warp",
         "combine", "adjust", "measure", "score", "rank", "step", "grow", "shrink", "bump", "spread", "pack", "count"]
NOUNS = ["value", "pair", "total", "items", "score", "offset", "size", "width", "depth", "level", "ratio",
         "weight", "span", "limit", "range", "index", "node", "edge", "block", "chunk", "frame", "slot", "token", "batch"]
ARGS = ["x", "y", "z", "a", "b", "n", "k", "m"]
OPS = ["+", "-", "*"]
CMPS = [">", "<", ">=", "<="]


@dataclass
class CodingSpec:
    name: str
    args: list[str]
    spec: str  # the sentence after "that"
    body: list[str]  # function body lines, without indentation
    level: int
    tests: list[tuple[tuple, object]]

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.args)})"

    def reference(self) -> str:
        lines = [f"def {self.signature()}:"]
        lines += [("    " + ln) for ln in self.body]
        return "\n".join(lines)


def _term(rng: random.Random, arg: str) -> str:
    return f"{arg} {rng.choice(OPS)} {rng.randint(2, 9)}"


def _expr(rng: random.Random, args: list[str], n_ops: int) -> str:
    expr = args[0]
    pool = args + [str(rng.randint(2, 9)) for _ in args]
    for i in range(n_ops):
        operand = args[i + 1] if i + 1 < len(args) else rng.choice(pool)
        expr = f"{expr} {rng.choice(OPS)} {operand}"
    return expr


def make_spec(rng: random.Random, level: int) -> CodingSpec:
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
    if level == 1:
        args = [rng.choice(ARGS)]
        e = _term(rng, args[0])
        spec, body = f"returns {e}", [f"return {e}"]
    elif level == 2:
        args = rng.sample(ARGS, 2)
        e = _expr(rng, args, 2)
        spec, body = f"returns {e}", [f"return {e}"]
    elif level == 3:
        args = rng.sample(ARGS, 2)
        a, b = args
        cmp = rng.choice(CMPS)
        e1, e2 = _term(rng, a), _term(rng, b)
        spec = f"returns {e1} if {a} {cmp} {b}, otherwise {e2}"
        body = [f"if {a} {cmp} {b}:", f"    return {e1}", f"return {e2}"]
    elif level == 4:
        args = [rng.choice(["n", "k", "m"])]
        v = "i"
        e = _term(rng, v)
        spec = f"returns the sum of {e} for {v} in range({args[0]})"
        body = ["total = 0", f"for {v} in range({args[0]}):", f"    total += {e}", "return total"]
    else:  # level 5: strings
        args = [rng.choice(["s", "text", "word"])]
        s = args[0]
        kind = rng.randrange(4)
        if kind == 0:
            k = rng.randint(2, 5)
            spec, body = f"returns {s} repeated {k} times", [f"return {s} * {k}"]
        elif kind == 1:
            spec, body = f"returns {s} in upper case", [f"return {s}.upper()"]
        elif kind == 2:
            spec, body = f"returns {s} reversed", [f"return {s}[::-1]"]
        else:
            k = rng.randint(1, 4)
            spec, body = f"returns the first {k} characters of {s}", [f"return {s}[:{k}]"]
    spec_obj = CodingSpec(name=name, args=args, spec=spec, body=body, level=level, tests=[])
    spec_obj.tests = _reference_tests(spec_obj, rng)
    return spec_obj


def _reference_tests(spec: CodingSpec, rng: random.Random) -> list[tuple[tuple, object]]:
    ns: dict = {}
    exec(spec.reference(), ns)  # our own generated reference code, not model output
    fn = ns[spec.name]
    tests = []
    for _ in range(4):
        if spec.level == 5:
            inp = ("".join(rng.choice("abcdefgh") for _ in range(rng.randint(3, 7))),)
        elif spec.level == 4:
            inp = (rng.randint(0, 9),)
        else:
            inp = tuple(rng.randint(-9, 12) for _ in spec.args)
        tests.append((inp, fn(*inp)))
    return tests


def test_program(spec_name: str, tests: list) -> str:
    lines = [f"assert {spec_name}({', '.join(repr(a) for a in args)}) == {expected!r}" for args, expected in tests]
    return "\n".join(lines)
