"""Gate v4's operating-characteristic rows (issue 35): `python benchmarks/gate_oc_v4.py [--rows errors,broken,routes]`.

* errors (35.1): toolcall-like items (tests/synth.lost_items_with_errors: gate_oc's "noisy" model, concentrated
  loss), 300 items x 3, the candidate at Δ = −tol with 1.9% of its requests erroring nowhere, at random, or on the
  items it loses; and at Δ = 0 with errors at random (the power they cost). Each trial is gate.gate_candidate on
  in-memory RunData (the path run_gate takes after loading the runs).
* broken (35.4): kld/broken's exact bound (bounds.share_bounds, as rule.measure calls it) at the looks of the default
  plan (J rounds of kld's 150 items, J from qverify.gate.plan_size, the levels of LookLevels) and at one fixed look of 300 items, items broken
  independently at a share from 0 to 1%.
* routes (35.2): P(PASS) at Δ = −tol over a user's whole procedure (one toolcall-like metric, gate_oc's noisy model,
  rounds of 60 items at the 12-look plan's levels, paired_bounds as each look decides): a budgeted sequence stopped
  by its time budget after look 3, then a fixed gate on the runs grown to 720 items at full alpha (the route before)
  and at the alpha qverify.gate.ledger.remaining leaves; and m budgeted sequences on the same items with fresh
  samples (new seeds), keeping the first PASS (what no tool can see). A vectorised reference simulation.

Every rate is the share of `trials` independent trials; results are checkpointed to benchmarks/results/gate_oc_v4.txt.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/synth.py holds the error item model
sys.path.insert(0, str(Path(__file__).resolve().parent))
from oc_models import ALPHA, TOL

from qverify.gate.boundaries import SPEND_GAMMA, nominal_levels, spending
from qverify.gate.bounds import paired_bounds, share_bounds
from qverify.gate.gate import gate_candidate
from qverify.gate.loader import RunData
from qverify.models import RunManifest, Sampling, ServingProfile, content_hash
from qverify.suites.kld import BROKEN_SHARE
from tests.synth import item_ids, lost_items_with_errors

OUT = Path(__file__).resolve().parent / "results" / "gate_oc_v4.txt"


def say(line: str) -> None:
    print(line, flush=True)
    with open(OUT, "a") as f:
        f.write(line + "\n")


def _run(build: str, x: np.ndarray, err: np.ndarray, drop: bool = False) -> RunData:
    ids = item_ids("toolcall", len(x))
    m = RunManifest(build_id=build, suite="toolcall", suite_version="1", item_set_hash=content_hash(ids), n_items=len(x),
                    replicates=x.shape[1], sampling=Sampling(), serving=ServingProfile(), complete=True)
    return RunData(build, "toolcall", m, ids, list(range(x.shape[1])), {"exact_call": np.where(err, np.nan, x)},
                   n_results=x.size, n_errors=int(err.sum()), errored=None if drop else err)


def error_rows(trials: int, rng: np.random.Generator, only: str = "") -> None:
    say(f"\n# errored requests (35.1): toolcall-like, 300 items x 3, tol {TOL}; gate_candidate per trial")
    say("| Δ | errors | where | P(PASS) exact_call | P(FAIL) | trials |")
    say("|---|---|---|---|---|---|")
    for delta, share, where, t in ((-TOL, 0.0, "none", trials), (-TOL, 0.019, "random", trials),
                                   (-TOL, 0.019, "lost", trials), (-TOL, 0.019, "lost, dropped (the rule before)", trials),
                                   (0.0, 0.0, "none", trials // 2), (0.0, 0.01, "random", trials // 2),
                                   (0.0, 0.019, "random", trials // 2)):
        if only not in where:
            continue
        v = []
        for _ in range(t):
            b, c, err = lost_items_with_errors(rng, 300, 3, delta, share, where=where.split(",")[0])
            rep = gate_candidate("cand", "cand", {"toolcall": _run("base", b, np.zeros_like(err))},
                                 {"toolcall": _run("cand", c, err, drop="dropped" in where)}, {})
            v.append(next(m.verdict for m in rep.metrics if m.metric == "toolcall/exact_call"))
        v = np.asarray(v)
        say(f"| {delta / TOL:+.0f} tol | {share:.1%} | {where} | {np.mean(v == 'PASS'):.3f} | {np.mean(v == 'FAIL'):.3f} "
            f"| {t} |")


def broken_rows(trials: int, rng: np.random.Generator, looks: int = 0, first: int = 150) -> None:
    from gate_oc_sequence import default_rounds

    looks = looks or default_rounds()  # the default plan's J (qverify.gate.plan_size)
    levels = nominal_levels(tuple(float(j) for j in range(1, looks + 1)), ALPHA)
    say(f"\n# kld/broken (35.4): tolerance {BROKEN_SHARE}, exact Clopper-Pearson; the default plan's {looks} looks of "
        f"{first} kld items, and one fixed look")
    say(f"| share of items broken | P(PASS) by look {looks} | median look of PASS | P(PASS) fixed 300 items | P(PASS) fixed 600 | "
        "trials |")
    say("|---|---|---|---|---|---|")
    for share in (0.0, 0.001, 0.0025, BROKEN_SHARE, 0.01):
        hit = rng.random((trials, first * looks)) < share
        at = np.full(trials, 0)
        for j, lv in enumerate(levels, 1):
            ok = share_bounds(-hit[:, :first * j].astype(float), BROKEN_SHARE, lv).lower > -BROKEN_SHARE
            at[(at == 0) & ok] = j
        fx = [float(np.mean(share_bounds(-hit[:, :n].astype(float), BROKEN_SHARE, ALPHA).lower > -BROKEN_SHARE))
              for n in (300, 600)]
        med = f"{np.median(at[at > 0]):.0f}" if (at > 0).any() else "-"
        say(f"| {share:.2%} | {np.mean(at > 0):.4f} | {med} | {fx[0]:.4f} | {fx[1]:.4f} | {trials} |")


def _noisy(rng: np.random.Generator, trials: int, n: int) -> np.ndarray:
    r, w = 0.60, 0.15
    u = rng.random((trials, n))
    return np.where(u < r, 1.0, np.where(u < r + w, 0.0, 0.15 + 0.7 * rng.random((trials, n))))


def _session(p: np.ndarray, q: np.ndarray, rng: np.random.Generator, k: int = 3, coupling: float = 0.5) -> np.ndarray:
    ub = rng.random(p.shape + (k,))
    uc = np.where(rng.random(p.shape + (k,)) < coupling, ub, rng.random(p.shape + (k,)))
    return (uc < q[..., None]).mean(-1) - (ub < p[..., None]).mean(-1)


def _sequence(d: np.ndarray, looks: int, first: int, alpha: float, stop_after: int | None = None) -> np.ndarray:
    """PASS by the sequential rule (paired_bounds at the plan's nominal levels, stopping at PASS or FAIL)."""
    lv = nominal_levels(tuple(float(j) for j in range(1, looks + 1)), alpha, SPEND_GAMMA)
    passed, failed = np.zeros(len(d), bool), np.zeros(len(d), bool)
    for j in range(1, (stop_after or looks) + 1):
        open_ = ~(passed | failed)
        b = paired_bounds(d[open_, :first * j], TOL, lv[j - 1], bounded=True)
        idx = np.flatnonzero(open_)
        failed[idx[b.upper < -TOL]] = True
        passed[idx[(b.lower > -TOL) & ~(b.upper < -TOL)]] = True
    return passed, failed


def route_rows(trials: int, rng: np.random.Generator, looks: int = 12, first: int = 60) -> None:
    from qverify.gate import ledger

    n = first * looks
    say(f"\n# routes (35.2): one toolcall-like metric at Δ = −tol (noisy model, concentrated loss, coupling 0.5, 3 "
        f"replicates), {looks}-look plan of {first}-item rounds")
    say("| procedure | P(PASS) | trials |")
    say("|---|---|---|")
    p = _noisy(rng, trials, n)
    q = np.where(rng.random((trials, n)) < TOL / 0.75, 0.0, p)
    d = _session(p, q, rng)
    seq_pass, seq_fail = _sequence(d, looks, first, ALPHA, stop_after=3)
    spent = float(spending(3 / looks, ALPHA, SPEND_GAMMA))
    with tempfile.TemporaryDirectory() as tmp:
        ledger.record(Path(tmp), "b", ["c"], ["toolcall"], "seq/0", spent, "budgeted", "g", 3, {"toolcall": 3 * first})
        left = ledger.remaining(Path(tmp), "b", ["c"], ["toolcall"], "fixed-x", ALPHA)
    undecided = ~(seq_pass | seq_fail)
    for label, a in (("stopped after look 3, then --fixed on 720 items at full alpha (the route before)", ALPHA),
                     (f"the same, the fixed gate at the alpha the ledger leaves ({left:.4f})", left)):
        fx = paired_bounds(d[undecided], TOL, a, bounded=True).lower > -TOL
        say(f"| {label} | {(seq_pass.sum() + fx.sum()) / trials:.4f} | {trials} |")
    full_pass, _ = _sequence(d, looks, first, ALPHA)
    say(f"| one budgeted sequence to its end (12 looks) | {full_pass.mean():.4f} | {trials} |")
    for m in (2, 3, 5):
        anyp = full_pass.copy()
        for _ in range(m - 1):  # the same items, fresh samples (new seeds): runs deleted and evaluated again
            anyp |= _sequence(_session(p, q, rng), looks, first, ALPHA)[0]
        say(f"| {m} budgeted sequences on the same items with fresh samples, keeping the first PASS | "
            f"{anyp.mean():.4f} | {trials} |")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", default="errors,broken,routes")
    ap.add_argument("--trials", type=int, default=0, help="override every row's trials")
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--only", default="", help="errors: only the rows whose `where` contains this")
    a = ap.parse_args(argv)
    rng = np.random.default_rng(a.seed)
    OUT.parent.mkdir(exist_ok=True)
    say(f"# gate_oc_v4.py {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC, seed {a.seed}")
    for row in a.rows.split(","):
        t0 = time.time()
        {"errors": lambda: error_rows(a.trials or 1000, rng, a.only), "broken": lambda: broken_rows(a.trials or 20000, rng),
         "routes": lambda: route_rows(a.trials or 20000, rng)}[row]()
        say(f"({row}: {time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
