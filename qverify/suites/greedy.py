"""greedy: greedy outputs must match the baseline's (the check for drafter-only changes).

Speculative decoding verifies every drafted token with the target, so a changed drafter
(e.g. FP8 weights) may change the accept length but never the greedy output, up to the
serving stack's own nondeterminism. Each item is a held-out coding or tool-call prompt
decoded at temperature 0; the metric `greedy/match` is computed at gate time: the share of
items whose output equals the baseline's, against the baseline's agreement with itself
across replicates. `qverify gate --recipe` adds this suite when a candidate's recipe
changes the drafter.
"""

from __future__ import annotations

from typing import Any, ClassVar

from qverify.models import Item, Response, Sampling, Score
from qverify.suites.base import Split, Suite, suites
from qverify.suites.coding import CodingSuite
from qverify.suites.metric_spec import MetricSpec
from qverify.suites.toolcall import generate_toolcall_items


@suites.register("greedy")
class GreedySuite(Suite):
    name = "greedy"
    version = "1"
    description = "Greedy outputs identical to the baseline's (drafter changes must not change them)."
    primary_metric = "completion_tokens"
    gate_metrics = (
        # a drafter change must not change greedy outputs beyond the stack's own irreproducibility
        MetricSpec("greedy/match", "greedy", "match", tolerance=0.02, statistic="match",
                   doc="greedy output identical to the baseline's, minus the baseline's own run-to-run identity"),
    )
    sampling: ClassVar[Sampling] = Sampling(temperature=0.0, top_p=1.0, max_tokens=64)
    default_n = 24
    pairwise = True

    def items(self, split: Split = "held-out", n: int | None = None, seed: int = 0, source: str = "synthetic") -> list[Item]:
        n = n or self.default_n
        coding = CodingSuite().items(split, (n + 1) // 2, seed)
        tools = generate_toolcall_items("toolcall", split, n // 2, seed)
        return [Item.make(self.name, split, messages=i.messages, tools=i.tools, target={},
                          metadata={"from": i.suite}) for i in coding + tools]

    def score(self, item: Item, response: Response) -> Score:
        # nothing to score on its own; the output is compared with the baseline's at gate time
        values: dict[str, Any] = {"completion_tokens": float(response.usage.get("completion_tokens", 0))}
        return Score(values=values)
