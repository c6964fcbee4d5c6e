"""Gate metrics as data: one small declaration each (name, suite, key, direction, statistic, tolerance).

A declaration whose name ends in `*` is a family expanded from the keys found in the runs
(e.g. `longctx/accuracy@*` becomes one metric per length bucket). `qverify.toml`'s
`[thresholds."<name>"]` overrides `gate` and `tolerance` per metric; a key may itself be
a glob (`"verifier/hygiene/*"`) and an exact name wins over a glob.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, replace
from fnmatch import fnmatchcase
from typing import Literal

from qverify.config import MetricRule
from qverify.errors import BadInput
from qverify.registry import Registry

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
    tolerance: float = 0.03  # absolute, in the metric's own units
    gated: bool = True
    statistic: Statistic = "mean"
    floor_margin: float | None = None  # trigger_f1: K2VV floor = min F1 between baseline runs - margin
    doc: str = ""

    @property
    def is_family(self) -> bool:
        return self.key.endswith("*")

    def expand(self, key: str) -> MetricSpec:
        return replace(self, name=f"{self.suite}/{key}", key=key)


gate_metrics: Registry[MetricSpec] = Registry("gate metric")


def declare(spec: MetricSpec) -> MetricSpec:
    gate_metrics.add(spec.name, spec)
    return spec


# K2VV's bar sits 2.81 points under the lowest F1 between official runs (75.81% -> 73%).
K2VV_MARGIN = 0.03

for _spec in (
    MetricSpec("coding/pass@1", "coding", "pass@1", doc="functional correctness, 1 sample"),
    MetricSpec("coding/pass@1/level*", "coding", "pass@1/level*", gated=False, doc="per difficulty level"),
    MetricSpec("toolcall/exact_call", "toolcall", "exact_call", doc="right tool(s) with exact arguments"),
    MetricSpec("toolcall/trigger", "toolcall", "trigger", doc="called a tool iff one was expected"),
    MetricSpec("toolcall/schema_valid", "toolcall", "schema_valid", gated=False),
    MetricSpec("toolcall/exact_call/*", "toolcall", "exact_call/*", gated=False, doc="per call kind"),
    MetricSpec("verifier/trigger_f1", "verifier", "tool_call_finish", statistic="trigger_f1",
               floor_margin=K2VV_MARGIN, doc="K2VV ToolCall-Trigger Similarity vs the baseline's runs"),
    MetricSpec("verifier/schema_accuracy", "verifier", "schema_accuracy", doc="K2VV ToolCall-Schema Accuracy"),
    MetricSpec("verifier/hygiene/*", "verifier", "hygiene/*", direction="lower", tolerance=0.02,
               doc="empty / leaked markup / truncated / repetition rates"),
    MetricSpec("verifier/finish/length", "verifier", "finish/length", direction="lower", gated=False),
    MetricSpec("verifier/finish/other", "verifier", "finish/other", direction="lower", gated=False),
    MetricSpec("longctx/accuracy", "longctx", "accuracy", doc="all needles exact"),
    # a bucket holds a fifth of the items, so its tolerance is wider
    MetricSpec("longctx/accuracy@*", "longctx", "accuracy@*", tolerance=0.10, doc="per context-length bucket"),
    MetricSpec("longctx/recall", "longctx", "recall", gated=False),
    # nats; llama.cpp reference points: q8_0 0.0014, q4_K_M 0.031 (Llama-3-8B)
    MetricSpec("kld/kld", "kld", "kld", direction="lower", tolerance=0.05, statistic="kld",
               doc="mean KL(baseline || candidate) minus the baseline's own run-to-run KL"),
    # a drafter change must not change greedy outputs beyond the stack's own irreproducibility
    MetricSpec("greedy/match", "greedy", "match", tolerance=0.02, statistic="match",
               doc="greedy output identical to the baseline's, minus the baseline's own run-to-run identity"),
    MetricSpec("kld/same_top", "kld", "same_top", tolerance=0.05, statistic="kld", gated=False),
    MetricSpec("kld/dp_rms", "kld", "dp_rms", direction="lower", tolerance=0.02, statistic="kld", gated=False),
):
    declare(_spec)


def specs_for_suite(suite: str) -> list[MetricSpec]:
    return [s for _, s in gate_metrics.items() if s.suite == suite]


def expand(specs: list[MetricSpec], keys: set[str]) -> list[MetricSpec]:
    """Concrete metrics for the score keys present in a run; exact declarations first, families after."""
    out: list[MetricSpec] = []
    taken: set[str] = set()
    for s in specs:
        if not s.is_family:
            out.append(s)
            taken.add(s.key)
    for s in specs:
        if s.is_family:
            for k in sorted(keys):
                if fnmatchcase(k, s.key) and k not in taken:
                    out.append(s.expand(k))
                    taken.add(k)
    return out


def apply_rules(spec: MetricSpec, rules: dict[str, MetricRule]) -> MetricSpec:
    """The spec with qverify.toml's gate/tolerance for it: an exact name beats the longest matching glob."""
    rule = rules.get(spec.name)
    if rule is None:
        globs = sorted((k for k in rules if any(c in k for c in "*?[") and fnmatchcase(spec.name, k)), key=len)
        rule = rules[globs[-1]] if globs else None
    if rule is None:
        return spec
    return replace(spec, gated=rule.gate, tolerance=spec.tolerance if rule.tolerance is None else rule.tolerance)


def check_rule_names(rules: dict[str, MetricRule]) -> None:
    """Unknown threshold names are errors with a did-you-mean (a typo must not silently ungate a metric)."""
    declared = gate_metrics.names()
    for name, rule in rules.items():
        if rule.tolerance is not None and rule.tolerance < 0:
            raise BadInput(f"threshold {name!r}: tolerance must be >= 0", fix="give an absolute tolerance like 0.03")
        if name in declared or any(fnmatchcase(name, d) or fnmatchcase(d, name) for d in declared):
            continue
        close = difflib.get_close_matches(name, declared, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise BadInput(f"qverify.toml [thresholds]: unknown gate metric {name!r}{hint}",
                       fix=f"use one of: {', '.join(declared)}")
