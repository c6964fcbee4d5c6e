"""longctx: RULER-style retrieval from coding-agent context, scored per length bucket."""

from __future__ import annotations

import re
from typing import ClassVar

from qverify.models import Item, Response, Sampling, Score
from qverify.suites import longctx_gen as gen
from qverify.suites.base import Split, Suite, split_of, split_rng, suites
from qverify.suites.metric_spec import MetricSpec

DEFAULT_LENGTHS = (128, 256, 512, 1024)  # tokens; real models: e.g. 8192..131072
TASKS = ("single", "multikey", "multivalue", "multiquery", "vartrack")
TASK_WEIGHTS = (0.35, 0.25, 0.15, 0.15, 0.10)
_PAIR = re.compile(r"([A-Z][A-Z_]*[A-Z])\s*=\s*([A-Z0-9_]+)")


def _needle(k: str, v: str) -> str:
    return f"{k} = {v}"


def make_task(rng, task: str) -> tuple[list[str], str, list[str]]:
    """-> (needles, question, expected answer lines)."""
    if task == "single":
        k, v = gen.key_name(rng), gen.value(rng)
        return [_needle(k, v)], f"What is the value of {k}?", [_needle(k, v)]
    if task in ("multikey", "multiquery"):
        keys = []
        while len(keys) < rng.randint(2, 4):
            k = gen.key_name(rng)
            if k not in keys:
                keys.append(k)
        vals = [gen.value(rng) for _ in keys]
        needles = [_needle(k, v) for k, v in zip(keys, vals)]
        if task == "multikey":
            i = rng.randrange(len(keys))
            return needles, f"What is the value of {keys[i]}?", [needles[i]]
        i, j = rng.sample(range(len(keys)), 2)
        return needles, f"What are the values of {keys[i]} and {keys[j]}?", [needles[i], needles[j]]
    if task == "multivalue":
        k = gen.key_name(rng)
        vals = [gen.value(rng) for _ in range(2)]
        needles = [_needle(k, v) for v in vals]
        return needles, f"List every value of {k}.", needles
    # vartrack: A = v; B = A; C = B -> which names hold v
    names = []
    while len(names) < 3:
        n = gen.key_name(rng)
        if n not in names:
            names.append(n)
    v = gen.value(rng)
    needles = [_needle(names[0], v), _needle(names[1], names[0]), _needle(names[2], names[1])]
    return needles, f"Which names hold the value {v}? Answer as NAME = {v} lines.", [_needle(n, v) for n in names]


@suites.register("longctx")
class LongContextSuite(Suite):
    name = "longctx"
    version = "1"
    description = "Find KEY = value needles in coding-agent context (single/multi-key, multi-value, multi-query, variable tracking)."
    primary_metric = "accuracy"
    gate_metrics = (
        MetricSpec("longctx/accuracy", "longctx", "accuracy", doc="all needles exact"),
        # a bucket holds a fifth of the items, so its tolerance is wider
        MetricSpec("longctx/accuracy@*", "longctx", "accuracy@*", tolerance=0.10, doc="per context-length bucket"),
        MetricSpec("longctx/recall", "longctx", "recall", gated=False),
    )
    sampling: ClassVar[Sampling] = Sampling(temperature=0.6, top_p=0.95, max_tokens=48)
    default_n = 60

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(self.options.get("lengths") or DEFAULT_LENGTHS)

    def items(self, split: Split = "held-out", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        n = n or self.default_n
        rng = split_rng(self.name, split, seed)
        out, seen = [], set()
        while len(out) < n:
            length = self.lengths[len(out) % len(self.lengths)]
            task = rng.choices(TASKS, TASK_WEIGHTS)[0]
            needles, question, answer = make_task(rng, task)
            key = "|".join(needles) + question
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            depths = [round(rng.random(), 2) for _ in needles]
            ctx = gen.haystack(rng, needles, length - self.count_tokens(question) - 12, self.count_tokens, depths)
            out.append(Item.make(
                self.name, split,
                messages=[{"role": "user", "content": f"{ctx}\n\n{question}"}],
                target={"answer": answer},
                metadata={"task": task, "length": length, "depths": depths},
            ))
        return out

    def answer_text(self, item: Item) -> str:
        return "\n".join(item.target["answer"])

    def item_counts(self) -> dict[str, str]:
        return {"synthetic": f"generated (default 60; lengths {list(self.lengths)})"}

    def score(self, item: Item, response: Response) -> Score:
        want = item.target["answer"]
        got_pairs = {f"{k} = {v}" for k, v in _PAIR.findall(response.content or "")}
        hits = sum(1 for w in want if w in got_pairs)
        exact = hits == len(want)
        values = {"accuracy": float(exact), "recall": hits / len(want)}
        values[f"accuracy@{item.metadata['length']}"] = float(exact)
        reason = None if exact else f"found {hits}/{len(want)} of {want}"
        return Score(values=values, reason=reason, answer=(response.content or "")[:200])
