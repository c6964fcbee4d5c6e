"""From two runs of a suite to each gate metric's paired matrices (decide.MetricData)."""

from __future__ import annotations

import numpy as np

from qverify.config import MetricRule
from qverify.gate import pairwise as pw
from qverify.gate.decide import MetricData
from qverify.gate.loader import RunData
from qverify.gate.metrics import MetricSpec, apply_rules, expand, specs_for_suite
from qverify.gate.stats import paired_rows


def common_items(base: RunData, cand: RunData) -> list[str]:
    return sorted(set(base.items) & set(cand.items))


def suite_metrics(base: RunData, cand: RunData, rules: dict[str, MetricRule]) -> list[MetricData]:
    """Every declared metric of the suite that the runs have data for, with qverify.toml's rules applied."""
    keys = set(base.scores) | set(cand.scores)
    specs = [apply_rules(s, rules) for s in expand(specs_for_suite(base.suite), keys)]
    items = common_items(base, cand)
    out: list[MetricData] = []
    kld_specs = [s for s in specs if s.statistic == "kld"]
    if kld_specs and base.logprobs is not None and cand.logprobs is not None:
        out += _kld(kld_specs, base, cand, items)
    for s in specs:
        if s.statistic == "mean" and s.key in keys:
            out.append(_mean(s, base, cand, items))
        elif s.statistic == "trigger_f1" and s.key in base.scores and s.key in cand.scores:
            out.append(_trigger(s, base, cand, items))
        elif s.statistic == "match" and base.outputs is not None and cand.outputs is not None:
            out.append(_match(s, base, cand, items))
    return out


def _mean(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> MetricData:
    b, c = base.matrix(s.key, items), cand.matrix(s.key, items)
    rows = paired_rows(b, c)
    return MetricData(s, b[rows], c[rows], len(base.replicates), len(cand.replicates))


def _trigger(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> MetricData:
    """K2VV trigger-F1: reference = a baseline run's finish_reason == tool_calls, per item 0/1."""
    b, c = base.matrix(s.key, items), cand.matrix(s.key, items)
    ybase, xcand = pw.trigger_matrices(b, c)
    rows = paired_rows(ybase, xcand)
    cross = pw.f1_cross(b, c)
    between = pw.f1_between(b)
    floor = pw.f1_floor(b, s.floor_margin) if s.floor_margin is not None else None
    details = {"f1_between_baseline_runs": between, "f1_candidate_vs_baseline_runs": cross,
               "counts": [pw.trigger_counts(b[:, k], c[:, j]) for j in range(c.shape[1]) for k in range(b.shape[1])]}
    return MetricData(s, ybase[rows], xcand[rows], b.shape[1], c.shape[1], within=False, floor=floor,
                      floor_value=float(np.mean(cross)) if cross else None, details=details)


def _match(s: MetricSpec, base: RunData, cand: RunData, items: list[str]) -> MetricData:
    """greedy/match: candidate-vs-baseline output identity against the baseline's identity with itself."""
    b, c = pw.match_matrices(base.output_rows(items), cand.output_rows(items))
    if b.shape[1] == 0:  # one baseline run: no self-agreement to compare with; assume a reproducible stack
        b = np.where(np.isnan(c[:, :1]), np.nan, 1.0)
    rows = paired_rows(b, c)
    return MetricData(s, b[rows], c[rows], len(base.replicates), len(cand.replicates), within=False,
                      details={"columns": "baseline: pairs of its runs; candidate: (baseline run, candidate run) pairs"})


def _kld(specs: list[MetricSpec], base: RunData, cand: RunData, items: list[str]) -> list[MetricData]:
    mats = pw.kld_matrices(base.logprob_rows(items), cand.logprob_rows(items), [s.key for s in specs])
    out = []
    for s in specs:
        b, c = mats[s.key]
        rows = paired_rows(b, c)
        out.append(MetricData(s, b[rows], c[rows], len(base.replicates), len(cand.replicates), within=False,
                              details={"columns": "baseline: ordered pairs of its runs; candidate: (baseline run, "
                                                  "candidate run) pairs"}))
    return out
