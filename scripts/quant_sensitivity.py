#!/usr/bin/env python
"""Quantization sensitivity of the embedded model: every built-in recipe's scores and gate verdict.

    python scripts/quant_sensitivity.py --workdir .qverify --run --limit 30 --replicates 2 --write-card
    python scripts/quant_sensitivity.py --workdir .qverify            # table from runs already there

--run builds every built-in recipe (`qverify build`) and evaluates it on the test split at each
suite's gating sampling (`qverify eval`): coding, toolcall, longctx and kld for recipes that
change the target, greedy for recipes that change the drafter (the drafter must not change
outputs). Builds and runs already in the workdir are reused (eval resumes).

The table: per recipe, the primary metric of each suite as the mean over replicates and
its range, the replicates x items behind it, KL to bf16, and `qverify gate` against bf16.
--write-card stores the table in the model card's asset folder (quant_sensitivity.json)
and re-renders the card's "Scores" and "Quantization sensitivity" sections from it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ASSET = ROOT / "qverify/assets/qverify-tiny"
TARGET_SUITES = ["coding", "toolcall", "longctx", "kld"]
COLUMNS = [("coding", "pass@1"), ("toolcall", "exact_call"), ("toolcall", "trigger"), ("longctx", "accuracy"),
           ("longctx", "accuracy@128"), ("longctx", "accuracy@512"), ("longctx", "accuracy@1024"),
           ("greedy", "match")]


def suites_for(recipe) -> list[str]:
    """What a recipe can change: a drafter-only recipe changes no output, only speed (greedy checks it)."""
    changes_target = recipe.target is not None or recipe.corrupt is not None or recipe.name == "bf16"
    out = list(TARGET_SUITES) if changes_target else []
    if recipe.drafter is not None or recipe.name == "bf16":
        out.append("greedy")
    return out


def qverify(workdir: Path, *args: str) -> None:
    cmd = [sys.executable, "-m", "qverify", "--workdir", str(workdir), *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("$", " ".join(cmd[2:]), flush=True)
    subprocess.run(cmd, check=False, env=env)  # a FAIL-worthy build still gets its table row


def build_ids(workdir: Path) -> dict[str, str]:
    """recipe -> newest build id."""
    from qverify.workdir import Workdir, manifest_path, read_build_manifest

    out: dict[str, tuple[float, str]] = {}
    for d in Workdir.at(workdir).build_dirs():
        m, mtime = read_build_manifest(d), manifest_path(d).stat().st_mtime
        if m.recipe not in out or mtime > out[m.recipe][0]:
            out[m.recipe] = (mtime, m.build_id)
    return {r: b for r, (_t, b) in out.items()}


def run_all(workdir: Path, recipes, limit: int, replicates: int, base_replicates: int, calib: list[str]) -> None:
    for r in recipes:
        if not suites_for(r.recipe):  # e.g. as_shipped on an unquantized source: the same thing as bf16
            print(f"{r.recipe.name} changes nothing here; no row", flush=True)
            continue
        if r.recipe.name not in build_ids(workdir):
            qverify(workdir, "build", "--recipe", r.recipe.name, *calib)
        build = build_ids(workdir).get(r.recipe.name)
        if build is None:
            print(f"build of {r.recipe.name} failed; no row", flush=True)
            continue
        reps = base_replicates if r.recipe.name == "bf16" else replicates
        qverify(workdir, "eval", build, "--suites", ",".join(suites_for(r.recipe)), "--replicates", str(reps),
                "--limit", str(limit))
        base = build_ids(workdir).get("bf16")
        if "greedy" in suites_for(r.recipe) and base and build != base:
            from qverify.pipeline import ensure_twins
            from qverify.workdir import Workdir

            # greedy/match's reference for a recipe that changes target and drafter: its target, bf16's drafter
            for twin in ensure_twins(Workdir.at(workdir), base, [build], print):
                qverify(workdir, "eval", twin, "--suites", "greedy", "--replicates", str(reps), "--limit", str(limit))


def cell(run, key: str) -> dict | None:
    m = run.scores.get(key) if run.exists else None
    if m is None or np.isnan(m).all():
        return None
    reps = [float(np.nanmean(c)) for c in m.T if not np.isnan(c).all()]
    return {"mean": round(float(np.mean(reps)), 3), "min": round(min(reps), 3), "max": round(max(reps), 3),
            "replicates": len(reps), "items": int((~np.isnan(m)).any(axis=1).sum())}


def measure(workdir: Path, recipes) -> dict:
    from qverify.gate.gate import run_gate
    from qverify.gate.loader import load
    from qverify.workdir import Workdir

    wd = Workdir.at(workdir)
    ids = build_ids(workdir)
    base = ids.get("bf16")
    rows, missing = [], []
    for r in recipes:
        name = r.recipe.name
        if name not in ids:
            continue
        b = ids[name]
        suites = [s for s in suites_for(r.recipe) if (wd.runs / b / s).exists()]
        runs = {s: load(wd.runs, b, s) for s in {s for s, _ in COLUMNS} | set(suites)}
        if not any(x.exists for x in runs.values()):
            missing.append(name)  # built, but its eval failed or was not run: said in the card, not dropped silently
            continue
        row = {"recipe": name, "control": r.recipe.control, "cells": {f"{s}/{k}": cell(runs[s], k) for s, k in COLUMNS},
               "kl": None, "verdict": "baseline", "failed": []}
        if name != "bf16" and base:
            gs = [s for s in suites if (wd.runs / base / s).exists()]
            c = run_gate(wd, base, [b], suites=gs, write=False).candidates[0]
            row["verdict"] = c.verdict
            row["failed"] = [m.metric for m in c.metrics if m.verdict == "FAIL" and m.gated]
            row["kl"] = next((round(m.candidate_mean, 4) for m in c.metrics if m.metric == "kld/kld"), None)
            for m in c.metrics:  # greedy/match exists only against its reference (computed at gate time)
                if m.metric == "greedy/match" and "greedy" in runs and runs["greedy"].exists:
                    v = round(m.candidate_mean, 3)
                    row["cells"]["greedy/match"] = {"mean": v, "min": v, "max": v, "items": m.n_items,
                                                    "replicates": len(runs["greedy"].replicates)}
        rows.append(row)
    return {"split": "test", "rows": rows, "not_measured": missing}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(".qverify"))
    ap.add_argument("--run", action="store_true", help="build and evaluate every recipe first")
    ap.add_argument("--recipes", default=None, help="comma-separated subset (default: every built-in recipe)")
    ap.add_argument("--limit", type=int, default=60, help="test items per suite")
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--base-replicates", type=int, default=None, help="bf16's replicates (default: --replicates)")
    ap.add_argument("--calib-samples", type=int, default=None, help="calibration samples per build (default: the recipe's)")
    ap.add_argument("--write-card", action="store_true")
    ap.add_argument("--note", default="", help="appended to the table's note in the card (e.g. why a row is missing)")
    args = ap.parse_args()
    from qverify.quantize.recipe import list_recipes

    recipes = [r for r in list_recipes() if r.builtin]
    recipes.sort(key=lambda r: (r.recipe.name != "bf16", r.recipe.name))
    if args.recipes:  # in the order given (the most telling first when time is short), bf16 first
        order = ["bf16", *[x for x in args.recipes.split(",") if x != "bf16"]]
        by_name = {r.recipe.name: r for r in recipes}
        recipes = [by_name[x] for x in order if x in by_name]
    if args.run:
        calib = ["--calib-samples", str(args.calib_samples)] if args.calib_samples else []
        run_all(args.workdir, recipes, args.limit, args.replicates, args.base_replicates or args.replicates, calib)
    from qverify.reference.model_card import sensitivity_table

    data = measure(args.workdir, recipes)
    data["note"] = ("`qverify eval` on the test split at each suite's gating sampling, by `scripts/quant_sensitivity.py`; "
                    "each cell: mean over replicates (range over replicates) [replicates × items]; gate: `qverify gate` "
                    "against bf16 at the default tolerances."
                    + (f" Builds calibrated on {args.calib_samples} samples." if args.calib_samples else "")
                    + (f" {args.note}" if args.note else ""))
    print(sensitivity_table(data))
    if args.write_card:
        from qverify.reference.model_card import render_card

        (ASSET / "quant_sensitivity.json").write_text(json.dumps(data, indent=1))
        render_card(ASSET)
        print(f"wrote {ASSET / 'quant_sensitivity.json'} and {ASSET / 'README.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
