"""coding: execution-scored function synthesis (synthetic specs, or HumanEval for real models)."""

from __future__ import annotations

import re
from typing import ClassVar

from qverify.models import Item, Response, Sampling, Score
from qverify.suites import coding_gen
from qverify.suites.base import Split, Suite, split_of, split_rng, suites
from qverify.suites.metric_spec import MetricSpec

LEVEL_WEIGHTS = {1: 0.15, 2: 0.25, 3: 0.25, 4: 0.2, 5: 0.15}
_FENCE = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def extract_code(text: str) -> str:
    """Code from a fenced block if there is one, else the raw response."""
    m = _FENCE.search(text or "")
    return (m.group(1) if m else (text or "")).strip("\n")


def build_program(target: dict, code: str) -> str:
    """The program the sandbox runs: model code made runnable, then the hidden tests.

    Rule (covers both answer shapes models give for HumanEval-style prompts):
      - the code defines the entry point (`def NAME(` at column 0): prepend
        target["prelude"] (the prompt's imports and helpers; "" for synthetic items);
      - otherwise, when the item has a target["prompt"] ending in a signature and
        docstring, the code is a body-only completion: append it to the prompt,
        indenting it by 4 spaces if its first line is not indented;
      - otherwise the code runs as is (and fails its tests if it lacks the function).
    """
    entry = target.get("entry_point")
    defines = bool(entry) and re.search(rf"^def\s+{re.escape(entry)}\s*\(", code, re.MULTILINE) is not None
    if defines or "prompt" not in target:
        head = target.get("prelude", "")
    else:
        head = target["prompt"]
        first = next((ln for ln in code.splitlines() if ln.strip()), "")
        if not first.startswith((" ", "\t")):
            code = "\n".join(("    " + ln) if ln.strip() else ln for ln in code.splitlines())
    return f"{head}{code}\n\n{target['tests']}\n"


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k (Chen et al. 2021): 1 - C(n-c, k) / C(n, k)."""
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


@suites.register("coding")
class CodingSuite(Suite):
    name = "coding"
    version = "1"
    description = "Write a small Python function from a spec; scored by executing hidden tests in a sandbox."
    primary_metric = "pass@1"
    gate_metrics = (
        MetricSpec("coding/pass@1", "coding", "pass@1", doc="functional correctness, 1 sample"),
        MetricSpec("coding/pass@1/level*", "coding", "pass@1/level*", gated=False, doc="per difficulty level"),
    )
    sampling: ClassVar[Sampling] = Sampling(temperature=0.6, top_p=0.95, max_tokens=96)
    sources = ("synthetic", "humaneval")
    default_n = 60
    runs_model_code = True  # scored by executing the answer: needs the sandbox (qverify.suites.sandbox)

    def items(self, split: Split = "held-out", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        if source == "humaneval":
            return self._humaneval(n)
        n = n or self.default_n
        rng = split_rng(self.name, split, seed)
        levels, weights = zip(*LEVEL_WEIGHTS.items())
        out, seen = [], set()
        while len(out) < n:
            spec = coding_gen.make_spec(rng, rng.choices(levels, weights)[0])
            key = spec.reference()
            if key in seen or split_of(key) != split:
                continue
            seen.add(key)
            prompt = f"Write a Python function `{spec.signature()}` that {spec.spec}."
            answer = f"```python\n{spec.reference()}\n```"
            out.append(Item.make(
                self.name, split,
                messages=[{"role": "user", "content": prompt}],
                target={"tests": coding_gen.test_program(spec.name, spec.tests), "entry_point": spec.name,
                        "reference": answer},
                metadata={"level": spec.level},
            ))
        return out

    def _humaneval(self, n: int | None) -> list[Item]:
        from qverify.suites.humaneval_source import humaneval_items

        return humaneval_items(n)

    def answer_text(self, item: Item) -> str:
        return item.target["reference"]

    def item_counts(self) -> dict[str, str]:
        return {"synthetic": "generated (default 60)", "humaneval": "164"}

    def score(self, item: Item, response: Response) -> Score:
        from qverify.suites.sandbox import run_tests

        code = extract_code(response.content or "")
        if not code.strip():
            return Score(values={"pass@1": 0.0}, reason="empty response", answer="")
        result = run_tests(build_program(item.target, code), allow_unsandboxed=self.allow_unsandboxed)
        # `sandboxed` records per item whether the full bwrap sandbox ran (1) or the weak fallback (0)
        values = {"pass@1": 1.0 if result.passed else 0.0, "sandboxed": 1.0 if result.sandbox == "bwrap" else 0.0}
        level = item.metadata.get("level")
        if level is not None:
            values[f"pass@1/level{level}"] = values["pass@1"]
        return Score(values=values, reason=None if result.passed else result.reason, answer=code)
