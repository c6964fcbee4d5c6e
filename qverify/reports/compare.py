"""`qverify report --compare`: every candidate gated against one baseline, ranked, read back from MLflow.

Reads only finished uploads (a gate run FINISHED, not superseded), keeps each
candidate's latest gate, and ranks: verdict (PASS, INCONCLUSIVE, FAIL, then a gate that decided no metric), then what the
build buys (KV tokens ratio, weights), then the quality margin.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from qverify.errors import BadInput
from qverify.reports.bundle import as_path
from qverify.reports.tracking import guard, resolve, session

VERDICT_ORDER = {"PASS": 0, "INCONCLUSIVE": 1, "FAIL": 2}
COLUMNS = {
    "tags.qverify.recipe": "recipe", "tags.qverify.build_id": "build_id", "tags.qverify.verdict": "verdict",
    "metrics.worst_delta_ratio": "worst_delta_ratio", "metrics.kv_tokens_ratio": "kv_tokens_ratio",
    "metrics.weights_change": "weights_change", "metrics.n_fail": "n_fail", "metrics.n_inconclusive": "n_inconclusive",
    "metrics.n_decided": "n_decided",
    "metrics.perf.accept_length": "accept_length", "metrics.perf.decode_tok_s": "decode_tok_s",
    "tags.qverify.gate_id": "gate_id", "start_time": "gated_at", "run_id": "run_id",
}


def _pick_baseline(gates, baseline: str | None) -> str:
    known = gates.sort_values("start_time")
    if baseline is None:
        return str(known.iloc[-1]["tags.qverify.baseline"])
    recipe_col = known.get("params.baseline.recipe")
    hit = known[known["tags.qverify.baseline"].str.startswith(baseline)
                | ((recipe_col == baseline) if recipe_col is not None else False)]
    if hit.empty:
        names = sorted(set(known["tags.qverify.baseline"]))
        raise BadInput(f"no finished gate against baseline {baseline!r}", fix=f"use one of: {', '.join(n[:12] for n in names)}")
    return str(hit.iloc[-1]["tags.qverify.baseline"])


def compare(workdir: Path, baseline: str | None = None, tracking_uri: str | None = None):
    """A pandas DataFrame, one row per candidate build, best first (column `rank`)."""
    import mlflow
    import pandas as pd

    workdir = as_path(workdir)
    target = resolve(workdir, tracking_uri)
    replay = shlex.join(["qverify", "report", "--compare"] + (["--baseline", baseline] if baseline else []))
    step = ["connecting"]
    with guard(target, step, replay), session(target) as client:  # guard first: opening the store is guarded too
        exps = [e.experiment_id for e in client.search_experiments(filter_string="name LIKE 'qverify/%'")]
        if not exps:
            raise BadInput(f"no qverify experiments at {target.display}", fix="upload a gate first: qverify report --gate ID")
        step.append("searching gate runs")
        gates = mlflow.search_runs(exps, "tags.`qverify.role` = 'gate' and attributes.status = 'FINISHED'",
                                   output_format="pandas")
        if gates.empty:
            raise BadInput(f"no finished gate uploads at {target.display}", fix="upload a gate first: qverify report --gate ID")
        if "tags.qverify.superseded" in gates:
            gates = gates[gates["tags.qverify.superseded"] != "true"]
        base = _pick_baseline(gates, baseline)
        ok = set(gates.loc[gates["tags.qverify.baseline"] == base, "run_id"])
        step.append("searching candidate runs")
        cands = mlflow.search_runs(exps, "tags.`qverify.role` = 'build' and tags.`qverify.build_role` = 'candidate'",
                                   output_format="pandas")
    cands = cands[cands["tags.mlflow.parentRunId"].isin(ok)] if not cands.empty else cands
    return ranked(pd.DataFrame({new: cands.get(old) for old, new in COLUMNS.items()}), base)


def ranked(df, base: str):
    """Each build's latest gate, best first: verdict, then a gate that decided nothing last, then what it buys."""
    if df.empty:
        return df.assign(rank=[], baseline=[])
    df = df.sort_values("gated_at").groupby("build_id", as_index=False).tail(1)
    df["_v"] = df["verdict"].map(VERDICT_ORDER).fillna(3)
    df.loc[df["n_decided"] == 0, "_v"] = 3  # decided nothing (refused: no comparable runs): below every decided gate
    df = df.sort_values(["_v", "kv_tokens_ratio", "weights_change", "worst_delta_ratio"],
                        ascending=[True, False, True, False], na_position="last").drop(columns="_v")
    df.insert(0, "rank", range(1, len(df) + 1))
    df.insert(1, "baseline", base)
    return df.reset_index(drop=True)
