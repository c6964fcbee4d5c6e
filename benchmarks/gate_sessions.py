"""The gate's error rates over independent REAL server sessions, on the damage dial.

    OMP_NUM_THREADS=1 python benchmarks/gate_sessions.py --out /tmp/calib --sessions 12 \\
        [--sigmas 0.4,0.6,0.85] [--limits toolcall=200,coding=60,kld=60] [--stop-at 03:40] [--summary]

Operating points, on the embedded qverify-tiny (each build made by the normal build path):
* `A/A uncoupled`: the candidate is `noise_shared` at sigma 0 (the bf16 weights under another build
  id), evaluated with a seed salt the baseline does not share: true Delta 0, no common random
  numbers (what a nondeterministic server gives at worst).
* `A/A same salt` (first `--crn-sessions` sessions only): the same weights with the baseline's salt.
  The embedded engine is deterministic and batch-invariant, so its answers equal the baseline's;
  the verdict then depends only on the item count (exact bound), so a few sessions show it.
* `sigma=<s>`: `noise_shared` at sigma s (seed 0, one fixed draw of the damage), with the
  baseline's salt (common random numbers, as a real gate has).

A session = for each build a fresh server launch (one per distinct item count) with the
session's salt, then one `run_gate` of every candidate against that session's baseline (a real
gate with several candidates shares its baseline the same way). Sessions differ ONLY by their
salt: the items are the suites' first n, as a user re-running the gate gets. Each session's
verdicts are appended as <out>/results/s<k>.json when it ends; a stopped run resumes (finished
sessions are skipped, a half-finished one continues its runs under the same salt).

The true Delta of each sigma comes from one larger reference run (`--ref-limits`, its own salt):
its Delta and SE per metric are printed next to the rates. The prediction beside the real rates
is benchmarks/gate_oc.py's simulated rule (its "noisy" T=0.6 model, not fitted to these suites)
for toolcall/exact_call at the reference Delta, the session's n and K, coupling 1 (same salt) or 0.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("OMP_NUM_THREADS", "1")

from damage_dial import RECIPE  # the dial's control recipe, one definition

from qverify.evals.store import atomic_write_text

SALT_BASE, UNCOUPLED, REF_SALT = 1000, 500_000, 999_999  # session k: salt 1000+k; A/A uncoupled: +500000
KEY_METRICS = ("toolcall/exact_call", "coding/pass@1", "kld/kld")


def parse_limits(text: str) -> dict[str, int]:
    return {k: int(v) for k, v in (x.split("=") for x in text.split(",") if x)}


def make_builds(out: Path, sigmas: list[float]) -> dict[str, str]:
    """Operating point -> build id (bf16 baseline under 'base'); content-addressed, so a rerun reuses them."""
    from qverify.quantize.build import build

    rec = out / "recipes"
    rec.mkdir(parents=True, exist_ok=True)
    ids = {"base": build("bf16", workdir=out).manifest.build_id}
    specs = {"A/A same salt": (0.0, 0), "A/A uncoupled": (0.0, 1)} | {f"sigma={s:g}": (s, 0) for s in sigmas}
    for name, (sigma, seed) in specs.items():
        path = rec / f"noise_{sigma:g}_{seed}.yaml"
        path.write_text(RECIPE.format(sigma=sigma, seed=seed))
        ids[name] = build(str(path), workdir=out).manifest.build_id
    return ids


def session_workdir(out: Path, name: str):
    """A workdir of its own (runs/, gates/, logs/) that shares the builds of <out>."""
    from qverify.workdir import Workdir

    wd = Workdir.at(out / "sessions" / name)
    wd.root.mkdir(parents=True, exist_ok=True)
    if not wd.builds.exists():
        wd.builds.symlink_to(out / "builds", target_is_directory=True)
    return wd.ensure()


def evaluate(wd, build_id: str, limits: dict[str, int], reps: int, salt: int) -> None:
    """Every suite at its own item count in ONE server launch (evaluate_build takes one --limit for all
    suites, which would cost a launch per count), without the TTFT probes: only verdicts matter here."""
    import asyncio

    from qverify.evals.runner import run_plan
    from qverify.models import ServingProfile
    from qverify.pipeline import EvalSpec, _versions, make_plan
    from qverify.serve import get_backend
    from qverify.suites.sandbox import require_sandbox

    build_dir, manifest = wd.resolve_build(build_id)
    spec = EvalSpec.from_config(None, replicates=reps, seed_salt=salt)
    plans = [make_plan(wd, build_dir, manifest, spec.override(suites=[s], limit=n)) for s, n in limits.items()]
    plan = plans[0]  # one plan over every suite, each with its own items (kld's corpus caps its own count)
    plan.suites = [p.suites[0] for p in plans]
    plan.items = {p.suites[0].name: p.items[p.suites[0].name] for p in plans}
    plan.perf_probes = 0
    if not any(plan.pending().values()) and all((m := plan.store(s).read_manifest()) and m.finished for s in limits):
        return
    plan.sandbox = require_sandbox(False)
    backend = get_backend("local")(build_dir, manifest, ServingProfile(), wd.logs)
    with backend as endpoint:
        asyncio.run(run_plan(plan, endpoint, backend.redacted_command(), backend.info(), alive=backend.alive,
                             versions=_versions(), show_progress=False))


def gate_rows(wd, base: str, cands: dict[str, str], suites: list[str]) -> dict[str, dict]:
    from qverify.config import QVerifyConfig
    from qverify.gate.gate import run_gate

    rep = run_gate(wd, base, list(cands.values()), suites, QVerifyConfig(suites=suites))
    by_id = {c.build_id: c for c in rep.candidates}
    out = {}
    for point, bid in cands.items():
        c = by_id[bid]
        out[point] = {"verdict": c.verdict, "seed_salts": c.seed_salts, "integrity": c.integrity,
                      "metrics": {m.metric: {"verdict": m.verdict, "delta": m.delta, "lo": m.ci_low, "hi": m.ci_high,
                                             "se": m.details.get("se"), "n": m.n_items}
                                  for m in c.metrics if m.gated}}
    return out


def run_session(out: Path, k: int, ids: dict[str, str], limits: dict[str, int], reps: int, crn: bool) -> None:

    path = out / "results" / f"s{k}.json"
    if path.exists():
        return
    t0, salt = time.time(), SALT_BASE + k
    wd = session_workdir(out, f"s{k}")
    points = {p: b for p, b in ids.items() if p != "base" and (crn or p != "A/A same salt")}
    evaluate(wd, ids["base"], limits, reps, salt)
    for p, b in points.items():
        evaluate(wd, b, limits, reps, salt + UNCOUPLED if p == "A/A uncoupled" else salt)
    rows = gate_rows(wd, ids["base"], points, list(limits))
    atomic_write_text(path, json.dumps({"session": k, "salt": salt, "limits": limits, "replicates": reps, "seconds": round(time.time() - t0),
                     "finished": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "points": rows}, indent=2, default=str))
    print(f"session {k} (salt {salt}) in {time.time() - t0:.0f}s: "
          + ", ".join(f"{p} {r['verdict']}" for p, r in rows.items()), flush=True)


def run_reference(out: Path, ids: dict[str, str], limits: dict[str, int], reps: int) -> None:

    path = out / "results" / "reference.json"
    if path.exists():
        return
    t0 = time.time()
    wd = session_workdir(out, "reference")
    damaged = {p: b for p, b in ids.items() if p.startswith("sigma=")}
    for b in [ids["base"], *damaged.values()]:
        evaluate(wd, b, limits, reps, REF_SALT)
    rows = gate_rows(wd, ids["base"], damaged, list(limits))
    atomic_write_text(path, json.dumps({"salt": REF_SALT, "limits": limits, "replicates": reps, "seconds": round(time.time() - t0), "points": rows}, indent=2, default=str))
    print(f"reference in {time.time() - t0:.0f}s", flush=True)


def past(stop_at: str | None) -> bool:
    if not stop_at:
        return False
    h, m = (int(x) for x in stop_at.split(":"))
    now = dt.datetime.now(dt.UTC)
    return now >= now.replace(hour=h, minute=m, second=0, microsecond=0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="builds, per-session workdirs and results/ (resumable)")
    ap.add_argument("--sessions", type=int, default=12)
    ap.add_argument("--sigmas", default="0.4,0.6,0.85")
    ap.add_argument("--limits", default="toolcall=200,coding=60,kld=60", help="items per suite in a session")
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--ref-limits", default="toolcall=600,coding=200,kld=200", help="items per suite, reference run")
    ap.add_argument("--ref-replicates", type=int, default=3)
    ap.add_argument("--crn-sessions", type=int, default=2, help="sessions that also run 'A/A same salt'")
    ap.add_argument("--reference-after", type=int, default=1, help="run the reference after this many sessions")
    ap.add_argument("--stop-at", help="HH:MM UTC: start no new session after this")
    ap.add_argument("--summary", action="store_true", help="only print the table of what is in <out>/results")
    ap.add_argument("--markdown", type=Path, help="also write the table here")
    a = ap.parse_args(argv)
    from calib_table import summary

    if not a.summary:
        import torch

        torch.set_num_threads(1)
        out = a.out.resolve()
        ids = make_builds(out, [float(x) for x in a.sigmas.split(",")])
        limits = parse_limits(a.limits)
        for k in range(a.sessions):
            if k == a.reference_after:
                run_reference(out, ids, parse_limits(a.ref_limits), a.ref_replicates)
            if past(a.stop_at):
                print(f"stop: past {a.stop_at} UTC", flush=True)
                break
            run_session(out, k, ids, limits, a.replicates, crn=k < a.crn_sessions)
    text = summary(a.out)
    print(text)
    if a.markdown:
        a.markdown.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
