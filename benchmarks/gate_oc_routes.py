"""P(PASS) at Δ = −tol along every route the tool offers a user to gate one candidate again, through the CLI's own
code path on disk (issue 35.2): `python benchmarks/gate_oc_routes.py [--trials 1000] [--routes a,a0,b,c,c2,d,e]`.

Each trial is a real workdir, real runs in the RunStore's format, the real ledger (runs/<candidate>/gate-looks.jsonl)
and qverify.rounds.gate, which `qverify gate` calls (the MLflow upload is skipped). No model is run: generation
alone is simulated, qverify.rounds._evaluator replaced by tests/routes_sim.py's, which draws each (item, replicate)'s
score from toolcall's fitted item model (p ~ Beta(0.58, 0.29), 3 replicates, half the replicate samples shared
between the builds, the candidate losing random items outright for a population Δ) and appends it to the store as
the runner would. One gated metric, toolcall/exact_call.

Scale: a look through the CLI's path reads every stored result (a few 0.1 s per trial at 60-item rounds), so by
default a round is 15 items and the tolerance 0.06 = 0.03 * sqrt(60 / 15): the same standardised margin, and the
same plan (J = 10 rounds, qverify.gate.plan_size). `--first 60 --tol 0.03` runs the real size, 3-4x slower.

Rows (the routes, tests/routes_sim.ROUTES), at Δ = −tol, and a0, the default route at Δ = 0 (its power):
  a  one budgeted sequence to its end (`qverify gate`)
  b  a time budget stopped after look 3 of the J looks, then `gate --fixed` on the runs grown to J rounds' items
  c  `qverify gate` INCONCLUSIVE, then `--seed-salt 7` (after `eval --fresh --seed-salt 7` where refused)
  c2 (b)'s stopped gate INCONCLUSIVE (alpha left), then (c)'s new salt
  d  `gate --fixed` after every round's items, gates/ deleted before each, up to 12 gates
  e  `qverify gate`; if not PASS, the runs copied into a new workdir and `qverify gate` there
Rows a0 and c2 run on every other trial (`--half`), the rest on every trial. A route PASSes when any gate along it PASSed (the user keeps the first PASS). Routes that start alike share their
first gate's trials (a, c, e; b, c2): each tail runs on a copy of the trial's workdir. `--bypass-ledger` runs the
rule before the ledger (every gate at its full alpha), for comparison.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from contextlib import nullcontext
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/routes_sim.py holds the harness

from tests import routes_sim as rs

OUT = Path(__file__).resolve().parent / "results" / "gate_oc_routes.txt"
ALL = ("a", "a0", "b", "c", "c2", "d", "e")


def one_trial(seed: int, tol: float, cfg, want: set[str]) -> dict[str, list[int]]:
    """The exit codes of every gate along each wanted route, on one trial's items and answers."""
    out: dict[str, list[int]] = {}
    if want & {"a", "c", "e"}:
        with rs.trial(seed, -tol, cfg) as t:
            t.gate()
            out["a"] = list(t.codes)
            for key in want & {"c", "e"}:
                with t.fork() as f:
                    rs.ROUTES[key][2](f)
                    out[key] = f.codes
    if want & {"b", "c2"}:
        with rs.trial(seed, -tol, cfg) as t:
            t.gate(**rs.stopped_budget(t))
            if "c2" in want:
                with t.fork() as f:
                    rs.new_salt(f)
                    out["c2"] = f.codes
            rs.fixed_on_grown_runs(t)
            out["b"] = t.codes
    if "d" in want:
        with rs.trial(seed, -tol, cfg) as t:
            rs.fixed_every_round(t)
            out["d"] = t.codes
    if "a0" in want:
        with rs.trial(seed, 0.0, cfg) as t:
            t.gate()
            out["a0"] = t.codes
    return {k: v for k, v in out.items() if k in want}


def row(key: str, codes: list[list[int]], tol: float) -> str:
    n = len(codes)
    p = sum(0 in c for c in codes) / n
    se = math.sqrt(max(p * (1 - p), 1e-12) / n)
    fail = sum(1 in c for c in codes) / n
    refused = sum(4 in c for c in codes) / n
    gates = sum(len(c) for c in codes) / n
    label = rs.ROUTES["a" if key == "a0" else key][0]
    delta = "0" if key == "a0" else "−tol"
    flag = " **over 0.05 + 2 SE**" if key != "a0" and p > 0.05 + 2 * se else ""
    return (f"| {key} | {label} | {delta} | {p:.4f} ± {se:.4f}{flag} | {fail:.4f} | {refused:.4f} | {gates:.2f} | {n} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=1000, help="trials per row")
    ap.add_argument("--routes", default=",".join(ALL), help=f"rows, of {','.join(ALL)}")
    ap.add_argument("--first", type=int, default=15, help="items per round (qverify.toml's limit)")
    ap.add_argument("--tol", type=float, default=None, help="toolcall/exact_call's tolerance (default 0.03 sqrt(60/first))")
    ap.add_argument("--half", default="a0,c2", help="rows run on every other trial (the slowest: a whole second "
                    "sequence each), so that the default run fits 25 min of one loaded core")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--bypass-ledger", action="store_true", help="every gate at full alpha (the rule before)")
    ap.add_argument("--no-write", action="store_true", help=f"print only (no {OUT.name})")
    args = ap.parse_args()
    want = {r.strip() for r in args.routes.split(",") if r.strip()}
    if want - set(ALL):
        ap.error(f"unknown routes {sorted(want - set(ALL))}; choose from {','.join(ALL)}")
    half = {r.strip() for r in args.half.split(",") if r.strip()}
    tol = args.tol if args.tol is not None else round(0.03 * math.sqrt(60 / args.first), 4)
    cfg = rs.config(tol=tol, first=args.first)
    rs._items("test", 1024, 0, cfg.source)  # toolcall's items, generated once
    results: dict[str, list[list[int]]] = {k: [] for k in want}
    t0 = time.time()
    with rs.ledger_bypassed() if args.bypass_ledger else nullcontext():
        for i in range(args.trials):
            rows = want if i % 2 == 0 else want - half
            for k, c in one_trial(args.seed * 1_000_003 + i, tol, cfg, rows).items():
                results[k].append(c)
            if (i + 1) % 100 == 0 or i == 0:
                rates = ", ".join(f"{k} {sum(0 in c for c in v) / len(v):.3f}" for k, v in sorted(results.items()))
                print(f"[{i + 1}/{args.trials} {time.time() - t0:.0f}s] P(PASS): {rates}", flush=True)
    elapsed = time.time() - t0
    lines = [f"\n# {time.strftime('%Y-%m-%d', time.gmtime())}: python benchmarks/gate_oc_routes.py "
             + " ".join(sys.argv[1:]),
             f"toolcall/exact_call alone gated, tolerance {tol}, {args.first}-item rounds, the default plan's "
             f"J = {rs.rounds_of(cfg)} looks, 3 replicates; qverify.rounds.gate on disk, generation simulated"
             + (" — LEDGER BYPASSED (every gate at full alpha: the rule before)" if args.bypass_ledger else "")
             + f"; {elapsed:.0f} s",
             "",
             ("| route | what the user does | Δ | P(PASS) ± SE (any gate along it) | P(FAIL) | share refused (exit 4) | "
              "gates per trial | trials |"),
             "|---|---|---|---|---|---|---|---|"]
    lines += [row(k, results[k], tol) for k in ALL if k in results]
    print("\n".join(lines))
    if not args.no_write:
        OUT.parent.mkdir(parents=True, exist_ok=True)
        with open(OUT, "a") as f:
            f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
