"""The table of benchmarks/gate_sessions.py: verdict rates over real sessions, Wilson intervals, the
reference run's true Delta and the simulated rule's prediction at that Delta, from <out>/results/."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import numpy as np
from scipy.stats import binomtest

VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE")
SIM_METRIC = "toolcall/exact_call"


def wilson(k: int, n: int) -> str:
    """k/n with its 95% Wilson score interval: the rate's uncertainty from n independent sessions."""
    if n == 0:
        return "–"
    ci = binomtest(k, n).proportion_ci(method="wilson")
    return f"{k}/{n} = {k / n:.2f} [{ci.low:.2f}, {ci.high:.2f}]"


def predicted(delta: float, n: int, k: int, coupling: float, trials: int = 4000) -> tuple[float, float]:
    """gate_oc.py's simulated P(PASS), P(FAIL) of one metric at this Delta (its 'noisy' T=0.6 model)."""
    from oc_models import Point, fixed

    r = fixed(Point(delta=min(delta, 0.0), n=n, k=k, coupling=coupling), trials, np.random.default_rng(0))
    return r["PASS"], r["FAIL"]


def sim_cell(d: float | None, n: int, k: int, couplings: tuple[float, ...]) -> str:
    """Predicted P(PASS) / P(FAIL), per coupling (the share of a replicate's draws the two builds share)."""
    if d is None:
        return "–"
    return "; ".join("c{:g}: {:.2f} / {:.2f}".format(c, *predicted(d, n, k, c)) for c in couplings)


def _ref(ref: dict, point: str, metric: str) -> str:
    if point.startswith("A/A"):
        return "0 (same weights)"
    m = (ref.get("points", {}).get(point) or {}).get("metrics", {}).get(metric)
    if not m:
        return "–"
    se = f" ± {m['se']:.4f}" if m.get("se") is not None else ""
    return f"{m['delta']:+.4f}{se}"


def _order(point: str) -> tuple[bool, float, str]:
    return (not point.startswith("A/A"), float(point.split("=")[1]) if "=" in point else 0.0, point)


def summary(out: Path) -> str:
    res = out / "results"
    sessions = [json.loads(p.read_text()) for p in sorted(res.glob("s*.json"))]
    ref_path = res / "reference.json"
    ref = json.loads(ref_path.read_text()) if ref_path.exists() else {}
    if not sessions:
        return "no finished sessions yet"
    lim, reps = sessions[0]["limits"], sessions[0]["replicates"]
    points = sorted({p for s in sessions for p in s["points"]}, key=_order)
    head = (f"gate over independent real sessions: {len(sessions)} sessions; per session {reps} replicates of "
            + ", ".join(f"{k} {v} items" for k, v in lim.items())
            + (f"; reference run: {ref['replicates']} replicates of " + ", ".join(f"{k} {v}" for k, v in ref["limits"].items())
               if ref else "; no reference run yet"))
    lines = [head, "",
             ("| point | sessions | true Δ exact_call (ref ± SE) | KL excess (ref ± SE) | build PASS | build FAIL | "
              "build INCONCLUSIVE | exact_call PASS | exact_call FAIL | sim exact_call PASS / FAIL at ref Δ (coupling c) | "
              "session Δ exact_call: mean (sd) | sim at that mean |"),
             "|" + "---|" * 12]
    for p in points:
        rows = [s["points"][p] for s in sessions if p in s["points"]]
        n = len(rows)
        cnt = {v: sum(r["verdict"] == v for r in rows) for v in VERDICTS}
        tm = [r["metrics"].get(SIM_METRIC, {}) for r in rows]
        t_cnt = {v: sum(m.get("verdict") == v for m in tm) for v in ("PASS", "FAIL")}
        deltas = [m["delta"] for m in tm if "delta" in m]
        if p.startswith("A/A"):
            true_d = 0.0
        else:
            true_d = (((ref.get("points") or {}).get(p) or {}).get("metrics") or {}).get(SIM_METRIC, {}).get("delta")
        couplings = (0.0,) if p == "A/A uncoupled" else (1.0,) if p == "A/A same salt" else (0.0, 1.0)
        sim = partial(sim_cell, n=lim.get("toolcall", 200), k=reps, couplings=couplings)
        mean_d = f"{np.mean(deltas):+.4f} (sd {np.std(deltas, ddof=1):.4f})" if len(deltas) > 1 else "–"
        sim_mean = sim(float(np.mean(deltas))) if len(deltas) > 1 else "–"
        lines.append(f"| {p} | {n} | {_ref(ref, p, SIM_METRIC)} | {_ref(ref, p, 'kld/kld')} | {wilson(cnt['PASS'], n)} | {wilson(cnt['FAIL'], n)} | "
                     f"{wilson(cnt['INCONCLUSIVE'], n)} | {wilson(t_cnt['PASS'], n)} | {wilson(t_cnt['FAIL'], n)} | "
                     f"{sim(true_d)} | {mean_d} | {sim_mean} |")
    causes: dict[str, dict[str, int]] = {}
    for s in sessions:
        for p, r in s["points"].items():
            for metric, m in r["metrics"].items():
                if m["verdict"] != "PASS":
                    c = causes.setdefault(p, {})
                    c[f"{metric} {m['verdict']}"] = c.get(f"{metric} {m['verdict']}", 0) + 1
    lines.append("")
    lines.append("Rates: k/n sessions with a 95% Wilson interval; each session is its own server launches with its own "
                 "seed salt. Metrics that kept a build from PASS (count over sessions):")
    for p in points:
        top = sorted(causes.get(p, {}).items(), key=lambda kv: -kv[1])[:5]
        lines.append(f"  {p}: " + (", ".join(f"{k} ×{v}" for k, v in top) or "none"))
    return "\n".join(lines)
