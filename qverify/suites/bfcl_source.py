"""BFCL (Berkeley Function-Calling Leaderboard, Apache-2.0) as toolcall items, offline.

Data: the JSONL files shipped inside the `bfcl-eval` wheel (installed with --no-deps:
its pinned dependencies are the vendor SDKs of every leaderboard model).

Matching: BFCL's `possible_answer` lists several acceptable values per argument ("" =
may be omitted; strings compared after stripping spaces and ,./-_*^ and lower-casing;
int accepted for float; parallel calls in any order). Rather than re-implement those
rules we call BFCL's own `ast_checker`, so scores match the leaderboard's AST metric.
Importing it pulls `bfcl_eval.constants.model_config`, which imports ~40 vendor SDKs
(anthropic, cohere, ...) only to look up one flag per model. We put a one-entry stand-in
for that module in `sys.modules` for the duration of the import and remove it after:
the checker keeps its reference, nothing else in the process sees the stand-in.

Tools are converted to OpenAI's schema as BFCL does for OpenAI-style models: dots in
function names become underscores (OpenAI names must match ^[a-zA-Z0-9_-]+$), and
BFCL's types map through its GORILLA_TO_OPENAPI table (dict→object, float→number, ...).
The checker is told the same (underscore_to_dot=True), so it expects `math_factorial`.
"""

from __future__ import annotations

import copy
import functools
import json
import sys
import types
from importlib import resources
from typing import Any

from qverify.errors import InfraError
from qverify.models import Item

SUITE = "toolcall"
CATEGORIES = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "irrelevance",
    "live_simple",
    "live_multiple",
)
NO_TOOL_ANSWER = "None of the available tools can do that."
_CHECKER_MODEL = "qverify-openai-style"  # our entry in the stand-in model config


def _data_dir():
    try:
        return resources.files("bfcl_eval") / "data"
    except ModuleNotFoundError as e:
        raise InfraError(
            "the BFCL source needs the bfcl-eval package",
            fix="pip install --no-deps bfcl-eval==2026.3.23 (pyproject's [tool.qverify] no-deps: its full dependency "
                "set is every vendor SDK; scripts/setup.sh installs it)",
        ) from e


def _read_jsonl(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@functools.cache
def load_category(category: str) -> tuple[list[dict], dict[str, list]]:
    """(entries, id -> possible answers) for one BFCL category."""
    if category not in CATEGORIES:
        raise ValueError(f"unknown BFCL category {category!r}")
    data = _data_dir()
    entries = _read_jsonl(data / f"BFCL_v4_{category}.json")
    answers_path = data / "possible_answer" / f"BFCL_v4_{category}.json"
    answers = {a["id"]: a["ground_truth"] for a in _read_jsonl(answers_path)} if answers_path.is_file() else {}
    return entries, answers


def _openai_types(props: dict[str, Any]) -> dict[str, Any]:
    from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI

    for p in props.values():
        p["type"] = GORILLA_TO_OPENAPI.get(p.get("type", "string"), "string")
        if isinstance(p.get("required"), bool):  # BFCL marks some nested fields `required: true`; not JSON schema
            p.pop("required")
        if "properties" in p:
            _openai_types(p["properties"])
        if isinstance(p.get("items"), dict):
            _openai_types({"_": p["items"]})
    return props


def to_openai_tool(function: dict) -> dict:
    f = copy.deepcopy(function)
    f["name"] = f["name"].replace(".", "_")
    f["parameters"]["type"] = "object"
    _openai_types(f["parameters"].get("properties", {}))
    return {"type": "function", "function": f}


def _concrete(alternatives: dict[str, list], required: set[str] = frozenset()) -> dict[str, Any]:
    """The first acceptable value per argument, omitting optional ones (""). A dict-valued
    argument's answer (or each dict in a list of dicts) maps its keys to alternatives
    again, one level deep, as BFCL's dict_checker reads it."""

    def first_of(alts: list) -> Any:
        return alts[0] if isinstance(alts, list) and alts else alts

    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: first_of(alts) for k, alts in v.items() if first_of(alts) != ""}
        if isinstance(v, list) and v and all(isinstance(e, dict) for e in v):
            return [value(e) for e in v]
        return v

    out = {}
    for k, alts in alternatives.items():
        given = [a for a in alts if a != ""]
        if given and (k in required or "" not in alts):  # BFCL sometimes lists "" first for required args
            out[k] = value(given[0])
    return out


def _representative(ground_truth: list[dict], functions: list[dict]) -> list[dict]:
    """One concrete expected call list (for `suites show` and training-style references)."""
    required = {f["name"]: set(f["parameters"].get("required", [])) for f in functions}
    return [
        {"name": name.replace(".", "_"), "arguments": _concrete(args, required.get(name, set()))}
        for call in ground_truth
        for name, args in call.items()
    ]


def _item(category: str, entry: dict, ground_truth: list[dict]) -> Item:
    kind = "irrelevant" if category == "irrelevance" else category
    return Item.make(
        SUITE,
        "test",
        messages=entry["question"][0],  # single-turn categories: one turn of (system?, user) messages
        tools=[to_openai_tool(f) for f in entry["function"]],
        target={
            "calls": _representative(ground_truth, entry["function"]),
            "no_tool_answer": NO_TOOL_ANSWER,
            "acceptable": {"category": category, "functions": entry["function"], "ground_truth": ground_truth},
        },
        metadata={"kind": kind, "source": "bfcl", "bfcl_id": entry["id"], "n_tools": len(entry["function"])},
    )


def bfcl_items(n: int | None = None, categories: tuple[str, ...] = CATEGORIES) -> list[Item]:
    """BFCL items, taken round-robin across categories (file order within each), so any
    prefix is a balanced mix; all of them (2,551 for the default categories) when n is None."""
    per_cat = []
    for cat in categories:
        entries, answers = load_category(cat)
        per_cat.append([(cat, e, answers.get(e["id"], [])) for e in entries])
    out: list[Item] = []
    for i in range(max(len(c) for c in per_cat)):
        for rows in per_cat:
            if i < len(rows):
                out.append(_item(*rows[i]))
                if n is not None and len(out) >= n:
                    return out
    return out


@functools.lru_cache(maxsize=1)
def _ast_checker():
    name = "bfcl_eval.constants.model_config"
    stand_in = types.ModuleType(name)
    stand_in.MODEL_CONFIG_MAPPING = {_CHECKER_MODEL: types.SimpleNamespace(underscore_to_dot=True)}
    previous = sys.modules.get(name)
    sys.modules[name] = stand_in
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval.ast_checker import ast_checker
    finally:
        if previous is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = previous
    return ast_checker, Language.PYTHON


def bfcl_match(acceptable: dict, parsed: list[tuple[str, Any]]) -> tuple[bool, str | None]:
    """Do the model's calls [(name, args)] match BFCL's possible answers? -> (ok, reason)."""
    if not acceptable["ground_truth"]:
        return (not parsed, None if not parsed else "called a tool where none fits")
    if any(not isinstance(args, dict) for _, args in parsed):
        return False, "arguments are not a JSON object"
    checker, python = _ast_checker()
    output = [{name: args} for name, args in parsed]
    try:
        res = checker(
            acceptable["functions"], output, acceptable["ground_truth"], python, acceptable["category"], _CHECKER_MODEL
        )
    except Exception as e:  # noqa: BLE001  (malformed model output the checker did not anticipate)
        return False, f"BFCL checker rejected the output ({type(e).__name__})"
    if res["valid"]:
        return True, None
    err = res.get("error") or [res.get("error_type", "no match")]
    first = err[0] if isinstance(err[0], str) else json.dumps(err[0])[:200]
    return False, f"{res.get('error_type', 'mismatch')}: {first}"[:300]
