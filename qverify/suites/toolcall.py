"""toolcall: does the model call the right tool with the right arguments, and only when it should?"""

from __future__ import annotations

import json
from typing import Any, ClassVar

import jsonschema

from qverify.chatfmt import IM_END, render_chat
from qverify.models import Item, Response, Sampling, Score
from qverify.suites import toolcall_gen as gen
from qverify.suites.base import Split, Suite, split_of, split_rng, suites
from qverify.suites.metric_spec import MetricSpec

IRRELEVANT_P = 0.2
PARALLEL_P = 0.2


def generate_toolcall_items(suite: str, split: Split, n: int, seed: int) -> list[Item]:
    rng = split_rng("toolcall", split, seed)
    names = sorted(gen.TOOLS)
    out, seen = [], set()
    while len(out) < n:
        kind = rng.choices(["single", "parallel", "irrelevant"], [1 - IRRELEVANT_P - PARALLEL_P, PARALLEL_P, IRRELEVANT_P])[0]
        n_tools = rng.randint(3, 6)
        first = rng.choice(names)
        calls: list[tuple[str, dict]] = []
        text, args = gen.make_call(rng, first)
        calls.append((first, args))
        if kind == "parallel":
            second = first if rng.random() < 0.5 else rng.choice(names)
            text2, args2 = gen.make_call(rng, second)
            if args2 == args and second == first:
                continue
            text = f"{text[:-1]}, and also: {text2[0].lower()}{text2[1:]}"
            calls.append((second, args2))
        needed = list(dict.fromkeys(c[0] for c in calls))  # ordered: a set's order varies with PYTHONHASHSEED
        confusable = [t for c in needed for t in gen.CONFUSABLE.get(c, []) if t not in needed]
        others = [t for t in names if t not in needed and t not in confusable]
        rng.shuffle(others)
        offered = list(needed) if kind != "irrelevant" else []
        pool = confusable + others
        for t in pool:
            if len(offered) >= n_tools:
                break
            if t not in offered:
                offered.append(t)
        rng.shuffle(offered)
        expected = [] if kind == "irrelevant" else [{"name": c, "arguments": a} for c, a in calls]
        key = json.dumps([text, sorted(offered)])
        if key in seen or split_of(text) != split:
            continue
        seen.add(key)
        out.append(Item.make(
            suite, split,
            messages=[{"role": "user", "content": text}],
            tools=[gen.TOOLS[t][0] for t in offered],
            target={"calls": expected, "no_tool_answer": gen.NO_TOOL_ANSWER},
            metadata={"kind": kind, "n_tools": len(offered)},
        ))
    return out


def reference_message(item: Item) -> dict[str, Any]:
    """The assistant message a perfect model would send (used to build training data)."""
    calls = item.target["calls"]
    if not calls:
        return {"role": "assistant", "content": item.target["no_tool_answer"]}
    return {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": c["name"], "arguments": json.dumps(c["arguments"])}} for c in calls]}


def check_calls(item: Item, response: Response) -> dict[str, Any]:
    """Shared by toolcall and verifier: parse, validate against schemas, compare to expected."""
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in item.tools or []}
    parsed, valid, reasons = [], [], []
    for c in response.tool_calls:
        try:
            args = json.loads(c.arguments)
        except (json.JSONDecodeError, TypeError) as e:
            valid.append(False)
            reasons.append(f"arguments of {c.name} are not JSON ({e.msg if hasattr(e, 'msg') else e})")
            parsed.append((c.name, None))
            continue
        parsed.append((c.name, args))
        if c.name not in schemas:
            valid.append(False)
            reasons.append(f"called {c.name}, which was not offered")
            continue
        try:
            jsonschema.validate(args, schemas[c.name])
            valid.append(True)
        except jsonschema.ValidationError as e:
            valid.append(False)
            reasons.append(f"{c.name} arguments invalid: {e.message}")
        except jsonschema.SchemaError as e:  # a broken tool schema (real data) must not kill scoring
            valid.append(False)
            reasons.append(f"{c.name} has an invalid schema: {e.message}")
    return {"parsed": parsed, "valid": valid, "reasons": reasons}


def _canon(name: str, args: Any) -> str:
    return json.dumps([name, args], sort_keys=True)


@suites.register("toolcall")
class ToolCallSuite(Suite):
    name = "toolcall"
    version = "1"
    description = "Pick the right coding-agent tool with exact arguments, abstain when no tool fits, parallel calls."
    primary_metric = "exact_call"
    gate_metrics = (
        MetricSpec("toolcall/exact_call", "toolcall", "exact_call", doc="right tool(s) with exact arguments"),
        MetricSpec("toolcall/trigger", "toolcall", "trigger", doc="called a tool iff one was expected"),
        MetricSpec("toolcall/schema_valid", "toolcall", "schema_valid", gated=False),
        MetricSpec("toolcall/exact_call/*", "toolcall", "exact_call/*", gated=False, doc="per call kind"),
    )
    sampling: ClassVar[Sampling] = Sampling(temperature=0.6, top_p=0.95, max_tokens=96)
    sources = ("synthetic", "bfcl")
    default_n = 60

    def items(self, split: Split = "held-out", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        if source == "bfcl":
            from qverify.suites.bfcl_source import bfcl_items

            return bfcl_items(n)
        return generate_toolcall_items(self.name, split, n or self.default_n, seed)

    def answer_text(self, item: Item) -> str:
        msg = reference_message(item)
        if msg.get("tool_calls"):  # the calls as the chat format writes them, without the role header
            return render_chat([msg], None, add_generation_prompt=False).split("<|im_middle|>", 1)[1][: -len(IM_END)]
        return msg["content"]

    def item_counts(self) -> dict[str, str]:
        return {"synthetic": "generated (default 60)", "bfcl": "BFCL v3 categories from bfcl-eval"}

    def score(self, item: Item, response: Response) -> Score:
        expected = item.target["calls"]
        check = check_calls(item, response)
        got_call = bool(response.tool_calls)
        values = {"trigger": 1.0 if got_call == bool(expected) else 0.0}
        if got_call:
            values["schema_valid"] = 1.0 if all(check["valid"]) else 0.0
        got = sorted(_canon(n, a) for n, a in check["parsed"])
        want = sorted(_canon(c["name"], c["arguments"]) for c in expected)
        acceptable = item.target.get("acceptable")  # BFCL items: several acceptable values per argument
        bfcl_reason = None
        if acceptable and expected and got_call:
            from qverify.suites.bfcl_source import bfcl_match

            exact, bfcl_reason = bfcl_match(acceptable, check["parsed"])
        else:
            exact = got == want if expected else not got_call
        values["exact_call"] = 1.0 if exact else 0.0
        values[f"exact_call/{item.metadata.get('kind', 'single')}"] = values["exact_call"]
        reason = None
        if not exact:
            if expected and not got_call:
                reason = "no tool call where one was expected"
            elif not expected and got_call:
                reason = "called a tool where none fits"
            else:
                reason = "; ".join(check["reasons"]) or bfcl_reason or f"calls differ: got {got}, want {want}"
        return Score(values=values, reason=reason, answer=json.dumps(check["parsed"]))
