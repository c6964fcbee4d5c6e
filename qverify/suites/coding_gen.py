"""Synthetic coding items: specs in words that must be composed into a program.

"returns the sum of the squares of the elements of xs that are odd" names no operator: the
model has to map each phrase (a reducer, a map, a filter, a threshold) to code and compose
them. Held-out items are *new combinations* of phrases, because the split key is the
program's behaviour (coding_check.signature), never its text.

A family is a regular phrase->code grammar with choices (`params`). Levels:
  1  one reducer with one map or one filter over a list; a count or keep over a string
  2  reducer + map + filter over a list; a string op with a character class
  3  reducer + map + filter over the elements at even/odd indices; running sums/maxima of a map;
     adjacent comparisons, gaps, arg-max
  4  stateful scans: the first element beyond (a multiple of) the running mean, the longest run of
     equal/increasing adjacent elements or characters, the first/last index or longest run of P
Hidden tests catch near-misses: for every program one choice away, the tests include an
input on which it differs, when one exists (coding_check.near_miss_tests).
Expected values come from running our own reference code here (trusted, never model output).
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field

from qverify.suites.coding_check import compile_function, near_miss_tests

VERBS = ["scale", "shift", "mix", "clip", "blend", "fold", "merge", "tally", "pick", "boost", "trim", "warp",
         "combine", "adjust", "measure", "score", "rank", "step", "grow", "shrink", "bump", "spread", "pack", "count"]
NOUNS = ["value", "pair", "total", "items", "score", "offset", "size", "width", "depth", "level", "ratio",
         "weight", "span", "limit", "range", "index", "node", "edge", "block", "chunk", "frame", "slot", "token", "batch"]
LIST_ARGS = ["xs", "nums", "values", "data", "items"]
STR_ARGS = ["s", "text", "word", "name"]
K = [2, 3, 4, 5, 6, 7]

# filter: (relative clause after "that are", predicate on x); {k} is a threshold
FILTERS = {"odd": ("odd", "x % 2 == 1"), "even": ("even", "x % 2 == 0"), "pos": ("positive", "x > 0"),
           "neg": ("negative", "x < 0"), "gt": ("greater than {k}", "x > {k}"), "ge": ("at least {k}", "x >= {k}"),
           "lt": ("less than {k}", "x < {k}"), "div": ("divisible by {k}", "x % {k} == 0")}
MAPS = {"sq": ("the squares of", "x * x"), "cube": ("the cubes of", "x ** 3"), "abs": ("the absolute values of", "abs(x)"),
        "dbl": ("the doubles of", "2 * x"), "neg": ("the negatives of", "-x"), "half": ("the halves (rounded down) of", "x // 2")}
# reducer: (phrase around {m}, code around {g} = "<expr> for x in xs[ if P]")
REDUCERS = {"sum": ("the sum of {m}", "return sum({g})"),
            "max": ("the largest of {m}, or 0 if there are none", "return max(({g}), default=0)"),
            "min": ("the smallest of {m}, or 0 if there are none", "return min(({g}), default=0)"),
            "list": ("the list of {m}", "return [{g}]"),
            "first": ("the first of {m}, or None if there are none", "return next(({g}), None)")}
# character classes: (noun phrase, predicate on c); {ch} is a letter
CHARS = {"vowel": ("the vowels", "c in 'aeiou'"), "cons": ("the consonants", "c not in 'aeiou'"),
         "before": ("the letters before '{ch}'", "c < '{ch}'"), "after": ("the letters after '{ch}'", "c > '{ch}'"),
         "eq": ("the copies of '{ch}'", "c == '{ch}'")}
LETTERS = list("eimnost")


def _filter(p: dict) -> tuple[str, str]:
    rel, pred = FILTERS[p["f"]]
    return rel.format(k=p["k"]), pred.format(k=p["k"])


def _chars(p: dict) -> tuple[str, str]:
    noun, pred = CHARS[p["c"]]
    return noun.format(ch=p["ch"]), pred.format(ch=p["ch"])


def _pipe(p: dict, a: str) -> tuple[str, list[str]]:
    """reducer of (map of) (the elements [at even/odd indices] of a[ that are F]); 'count' ignores the map."""
    pos = p.get("pos", "all")
    elems = f"the elements of {a}" if pos == "all" else f"the elements at {pos} indices of {a}"
    loop = f"x in {a}" if pos == "all" else f"i, x in enumerate({a})"
    conds = [] if pos == "all" else [f"i % 2 == {0 if pos == 'even' else 1}"]
    if p["f"] != "all":
        rel, pred = _filter(p)
        elems = f"{elems} that are {rel}"
        conds.append(pred)
    gen_tail = f"for {loop}" + (f" if {' and '.join(conds)}" if conds else "")
    if p["r"] == "count":
        return f"returns the number of {elems}", [f"return sum(1 {gen_tail})"]
    phrase, expr = (elems, "x") if p["m"] == "id" else (f"{MAPS[p['m']][0]} {elems}", MAPS[p["m"]][1])
    spec, code = REDUCERS[p["r"]]
    return f"returns {spec.format(m=phrase)}", [code.format(g=f"{expr} {gen_tail}")]


def _strop(p: dict, a: str) -> tuple[str, list[str]]:
    noun, pred = _chars(p)
    op = p["op"]
    if op == "count":
        return f"returns the number of characters of {a} that are {noun[4:]}", [f"return sum(1 for c in {a} if {pred})"]
    if op == "keep":
        return f"returns {noun} of {a}, in order, as a string", [f"return ''.join(c for c in {a} if {pred})"]
    if op == "drop":
        return f"returns {a} with {noun} removed", [f"return ''.join(c for c in {a} if not ({pred}))"]
    if op == "upper":
        return f"returns {a} with {noun} in upper case", [f"return ''.join(c.upper() if {pred} else c for c in {a})"]
    return (f"returns the index of the first of {noun} in {a}, or -1 if there is none",
            [f"return next((i for i, c in enumerate({a}) if {pred}), -1)"])


def _scan(p: dict, a: str) -> tuple[str, list[str]]:
    t = p["t"]
    if t == "running":
        word, op = {"sum": ("sums", "out[-1] + y"), "max": ("maximums", "max(out[-1], y)"),
                    "min": ("minimums", "min(out[-1], y)")}[p["v"]]
        what, expr = (a, "x") if p["m"] == "id" else (f"{MAPS[p['m']][0]} the elements of {a}", MAPS[p["m"]][1])
        return (f"returns the running {word} of {what}, as a list",
                ["out = []", f"for x in {a}:", f"    y = {expr}", "    out.append(y if not out else " + op + ")",
                 "return out"])
    if t == "adjacent":
        word, op = {"gt": ("greater than", ">"), "lt": ("less than", "<"), "eq": ("equal to", "==")}[p["v"]]
        return (f"returns the number of elements of {a} that are {word} the element before them",
                [f"return sum(1 for i in range(1, len({a})) if {a}[i] {op} {a}[i - 1])"])
    if t == "gap":
        word, fn = {"max": ("largest", "max"), "min": ("smallest", "min")}[p["v"]]
        return (f"returns the {word} absolute difference between adjacent elements of {a}, or 0 if there are none",
                [f"return {fn}((abs({a}[i] - {a}[i - 1]) for i in range(1, len({a}))), default=0)"])
    if t == "argext":
        word, fn = {"max": ("largest", "max"), "min": ("smallest", "min")}[p["v"]]
        return (f"returns the index of the {word} element of {a} (the first one if tied), or -1 if {a} is empty",
                [f"if not {a}:", "    return -1", f"return {a}.index({fn}({a}))"])
    if t == "mean":
        word, op = {"gt": ("greater than", ">"), "lt": ("less than", "<")}[p["v"]]
        times, mult = {1: ("", ""), 2: ("twice ", "2 * "), 3: ("three times ", "3 * ")}[p["x"]]
        return ((f"returns the index of the first element of {a} {word} {times}the mean of the elements before it, "
                 "or -1 if there is none"),
                ["total = 0", f"for i, x in enumerate({a}):", f"    if i > 0 and x {op} {mult}total / i:",
                 "        return i", "    total += x", "return -1"])
    if t == "runs":
        what = "characters in" if p["kind"] == "str" else "elements of"
        word, op = {"eq": ("equal", "=="), "inc": ("strictly increasing", ">"), "dec": ("strictly decreasing", "<")}[p["v"]]
        return (f"returns the length of the longest run of {word} adjacent {what} {a}",
                ["best = cur = 0", "prev = None", f"for x in {a}:", f"    cur = cur + 1 if prev is not None and x {op} prev else 1",
                 "    best = max(best, cur)", "    prev = x", "return best"])
    raise ValueError(t)


def _scan_filter(p: dict, a: str) -> tuple[str, list[str]]:
    rel, pred = _filter(p)
    if p["t"] == "first":
        return (f"returns the index of the first element of {a} that is {rel}, or -1 if there is none",
                [f"return next((i for i, x in enumerate({a}) if {pred}), -1)"])
    if p["t"] == "last":
        return (f"returns the index of the last element of {a} that is {rel}, or -1 if there is none",
                [f"return max((i for i, x in enumerate({a}) if {pred}), default=-1)"])
    return (f"returns the length of the longest run of consecutive elements of {a} that are {rel}",
            ["best = cur = 0", f"for x in {a}:", f"    cur = cur + 1 if {pred} else 0", "    best = max(best, cur)",
             "return best"])


@dataclass(frozen=True)
class Family:
    name: str
    level: int
    kind: str  # argument kind: "list" or "str"
    params: dict[str, list]
    render: Callable[[dict, str], tuple[str, list[str]]]
    valid: Callable[[dict], bool] = field(default=lambda p: True)


def _one_step(p: dict) -> bool:
    """Level 1: a count of a filter, or another reducer over exactly one of a map and a filter."""
    if p["r"] == "count":
        return p["f"] != "all"
    return (p["m"] != "id") != (p["f"] != "all")


_ALL_F = ["all", *FILTERS]
_MAPS = ["id", *MAPS]
FAMILIES = [
    Family("pipe1", 1, "list", {"r": ["count", *REDUCERS], "m": _MAPS, "f": _ALL_F, "k": K}, _pipe, _one_step),
    Family("str1", 1, "str", {"op": ["count", "keep"], "c": list(CHARS), "ch": LETTERS}, _strop),
    Family("pipe2", 2, "list", {"r": list(REDUCERS), "m": list(MAPS), "f": list(FILTERS), "k": K}, _pipe),
    Family("str2", 2, "str", {"op": ["drop", "upper", "first"], "c": list(CHARS), "ch": LETTERS}, _strop),
    Family("pipe_pos", 3, "list", {"r": ["count", *REDUCERS], "m": _MAPS, "f": _ALL_F, "k": K, "pos": ["even", "odd"]},
           _pipe, lambda p: p["r"] != "count" or p["m"] == "id"),
    Family("running", 3, "list", {"t": ["running"], "v": ["sum", "max", "min"], "m": _MAPS}, _scan),
    Family("adjacent", 3, "list", {"t": ["adjacent"], "v": ["gt", "lt", "eq"]}, _scan),
    Family("extreme", 3, "list", {"t": ["gap", "argext"], "v": ["max", "min"]}, _scan),
    Family("mean", 4, "list", {"t": ["mean"], "v": ["gt", "lt"], "x": [1, 2, 3]}, _scan),
    Family("runs", 4, "list", {"t": ["runs"], "v": ["eq", "inc", "dec"], "kind": ["list"]}, _scan),
    Family("str_runs", 4, "str", {"t": ["runs"], "v": ["eq", "inc", "dec"], "kind": ["str"]}, _scan),
    Family("scanf", 4, "list", {"t": ["first", "last", "run"], "f": list(FILTERS), "k": K}, _scan_filter),
]
LEVEL_WEIGHTS = {1: 0.2, 2: 0.3, 3: 0.3, 4: 0.2}


@dataclass
class CodingSpec:
    name: str
    args: list[str]
    spec: str  # the sentence after "that"
    body: list[str]  # function body lines, without indentation
    level: int
    kind: str
    family: str
    tests: list[tuple[tuple, object]] = field(default_factory=list)

    def signature(self) -> str:
        return f"{self.name}({', '.join(self.args)})"

    def reference(self) -> str:
        return "\n".join([f"def {self.signature()}:"] + [("    " + ln) for ln in self.body])


def _fix_unused(fam: Family, p: dict) -> dict:
    """Choices that do not enter the program are pinned, so they never make two 'different' items."""
    p = dict(p)
    if "k" in p and p.get("f") not in ("gt", "ge", "lt", "div"):
        p["k"] = K[0]
    if "ch" in p and p["c"] in ("vowel", "cons"):
        p["ch"] = LETTERS[0]
    if fam.name.startswith("pipe") and p["r"] == "count":
        p["m"] = "id"
    return p


def draw(rng: random.Random, level: int) -> tuple[Family, dict, str, str]:
    """(family, params, function name, argument name) for one candidate item of `level`."""
    fams = [f for f in FAMILIES if f.level == level]
    while True:
        fam = rng.choice(fams)
        p = _fix_unused(fam, {k: rng.choice(v) for k, v in fam.params.items()})
        if fam.valid(p):
            break
    name = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}"
    return fam, p, name, rng.choice(LIST_ARGS if fam.kind == "list" else STR_ARGS)


def build(fam: Family, p: dict, name: str, arg: str) -> CodingSpec:
    spec, body = fam.render(p, arg)
    return CodingSpec(name=name, args=[arg], spec=spec, body=body, level=fam.level, kind=fam.kind, family=fam.name)


def neighbours(fam: Family, p: dict) -> list[dict]:
    """Every valid choice set one change away from `p` (the near-misses hidden tests must catch)."""
    out = []
    for key, options in fam.params.items():
        for v in options:
            q = _fix_unused(fam, {**p, key: v})
            if q != p and fam.valid(q) and q not in out:
                out.append(q)
    return out


def input_pool(rng: random.Random, kind: str, n: int = 40) -> list[tuple]:
    if kind == "str":
        return [("".join(rng.choice("abeikmnostuz") for _ in range(rng.randint(0 if i > 2 else 3, 9))),)
                for i in range(n)]
    return [([rng.randint(-6, 9) for _ in range(rng.randint(0 if i > 2 else 4, 8))],) for i in range(n)]


def with_tests(fam: Family, p: dict, spec: CodingSpec, rng: random.Random) -> CodingSpec:
    fn = compile_function(spec.reference(), spec.name)
    others = [build(fam, q, spec.name, spec.args[0]) for q in neighbours(fam, p)]
    nbs = [compile_function(o.reference(), o.name) for o in others]
    spec.tests = near_miss_tests(fn, nbs, input_pool(rng, fam.kind))
    return spec


def test_program(spec_name: str, tests: list) -> str:
    lines = [f"assert {spec_name}({', '.join(repr(a) for a in args)}) == {expected!r}" for args, expected in tests]
    return "\n".join(lines)
