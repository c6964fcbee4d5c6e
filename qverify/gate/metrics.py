"""Gate metrics: each suite declares its own (`Suite.gate_metrics`, qverify/suites/<name>.py); here they
are expanded against the runs and overridden by qverify.toml.

A declaration whose name ends in `*` is a family expanded from the keys found in the runs
(e.g. `longctx/accuracy@*` becomes one metric per length bucket). `qverify.toml`'s
`[thresholds."<name>"]` overrides `gate` and `tolerance` per metric; a key may itself be
a glob (`"verifier/hygiene/*"`) and an exact name wins over a glob.
"""

from __future__ import annotations

from dataclasses import replace
from fnmatch import fnmatchcase

from qverify.config import MetricRule
from qverify.errors import BadInput
from qverify.registry import Registry
from qverify.suites import gate_metrics, suite_gate_metrics
from qverify.suites.metric_spec import MetricSpec


def gate_metric_registry() -> Registry[MetricSpec]:
    """Every suite's declarations by name (a name declared twice is an error)."""
    reg: Registry[MetricSpec] = Registry("gate metric")
    for spec in gate_metrics():
        reg.add(spec.name, spec)
    return reg


def specs_for_suite(suite: str) -> list[MetricSpec]:
    return suite_gate_metrics(suite)


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
    registry = gate_metric_registry()
    declared = registry.names()
    for name, rule in rules.items():
        if rule.tolerance is not None and rule.tolerance < 0:
            raise BadInput(f"threshold {name!r}: tolerance must be >= 0", fix="give an absolute tolerance like 0.03")
        if name in declared or any(fnmatchcase(name, d) or fnmatchcase(d, name) for d in declared):
            continue
        raise BadInput(f"qverify.toml [thresholds]: {registry.unknown_message(name)}",
                       fix=f"use one of: {', '.join(declared)}")
