"""A gate metric as data: name, suite, key, direction, statistic, tolerance.

Each suite declares its own in its file (`Suite.gate_metrics`); the gate reads them from there.
A declaration whose key ends in `*` is a family expanded from the keys found in the runs
(e.g. `longctx/accuracy@*` becomes one metric per length bucket).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

Direction = Literal["higher", "lower"]
# how a metric's per-item replicate matrices are made from the runs:
#   mean        per-item score values as written by the suite's scorer
#   trigger_f1  centred jackknife pseudo-values of K2VV trigger-F1 against the baseline's runs
#   kld         per-item kl_stats() of each run against the baseline's runs (needs logprobs)
#   match       per-item output identity with the baseline's runs (greedy suite)
Statistic = Literal["mean", "trigger_f1", "kld", "match"]


@dataclass(frozen=True)
class MetricSpec:
    name: str  # "<suite>/<key>"; a trailing "*" declares a family expanded from the data
    suite: str
    key: str  # score key (mean), kl_stats key (kld), or the per-item 0/1 key F1 is built from (trigger_f1)
    direction: Direction = "higher"
    # absolute, in the metric's own units. 0.03 is a policy choice, not derived: about K2VV's own margin (its bar
    # of 73% sits 2.8 points under the lowest official F1, 75.81%; docs/gate.md), tighter than llm-compressor's
    # 0.95 recovery (5% relative) and vLLM's rtol 0.08. Set per metric in qverify.toml [thresholds].
    tolerance: float = 0.03
    gated: bool = True
    statistic: Statistic = "mean"
    floor_margin: float | None = None  # trigger_f1: K2VV floor = min F1 between baseline runs - margin
    cap: float | None = None  # kld: each per-pair value capped at `cap` (d_i in [-cap, cap]: the exact bound decides)
    above: float | None = None  # kld: the per-item share of pairs whose value exceeds `above` (a rate in [0, 1])
    zero_unless: str | None = None  # mean: the key's absence counts as 0 where this 0/1 key is 0 (verifier's
    # schema_accuracy is scored only on answers that call a tool; an answer that calls none scores 0, so a candidate
    # that stops calling where its schema would be wrong does not gain: issue 35.5)
    broken: float | None = None  # kld: the share of items the candidate breaks outright (its KL beyond `broken` and
    # beyond the baseline's own on the item), one-sided exact (Clopper-Pearson): qverify.gate.bounds.share_bounds
    doc: str = ""
    scope: str | None = None  # what a derived tolerance covers, when less than it seems: gate.json says it beside the metric

    @property
    def is_family(self) -> bool:
        return self.key.endswith("*")

    def expand(self, key: str) -> MetricSpec:
        return replace(self, name=f"{self.suite}/{key}", key=key)
