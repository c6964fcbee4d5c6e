"""kld/kld near its margin (issue 35.5): the exact betting bound against the t bound and candidate constructions.

`python benchmarks/kld_hybrid.py [--trials 4000] [--level-trials 10000] [--n 150 300] [--plan 4000]` prints one
table of P(PASS) per model, excess and construction, with the trial count of every rate (results/kld_hybrid.txt).
kld/kld gates the per-pair KL capped at KLD_CAP (0.1 nats), tol 0.01. Its bound was the exact betting bound alone,
because the t bound loses its level under heavy-tailed per-item KL; on light-tailed KL that bound had far less power
near the margin than a t bound (issue 35.5: n = 150, 0.45 vs 0.92 at 0.8 tol, 0.03 vs 0.46 at 0.9 tol).

Item models (tests/synth.py: the baseline's own KL Gamma(0.5) with mean KL_SELF; excess is of the capped mean):
* light own=0: the same with a deterministic baseline (own KL 0, as the embedded engine's; the issue's figures);
* light: the candidate's per-item KL lognormal with log-scale SD 0.66, the real fp8kv_nvfp4shared build's
  (docs/gate-results.md, "Per-item KL on a real build"); tight: log-scale SD 0.25;
* heavy (the issue-29 table): lognormal 1.0 / 2.0, Pareto (Lomax) 2.5 / 3.5;
* candidate-only tail: a share p of the candidate's items at the cap (or at `at` nats), the rest light (or tight),
  the baseline light; the light part's mean set so that the capped excess is exactly the given one.

Constructions (PASS at one fixed look, alpha 0.05; oriented d = own - candidate, scaled by the cap for betting):
* old betting: the rule before issue 35.5 (betting.p_value at the margin, p_pass < alpha);
* t: the Hall-corrected t bound on the same capped d (paired_bounds, always_exact=False);
* bet c=.99/prior: betting with the capital share c 0.95 -> 0.99 and s2's prior 0.25 -> 0.01 (both keep Ville);
* self-KL regime: t when the baseline's own per-item KL looks light (excess kurtosis of its capped values < 20
  and none above cap / 2), betting otherwise: the regime is set by data that do not involve the candidate;
* t if no tail w=.2: betting at alpha / 5, or the t bound at 4 alpha / 5 when no item's excess reaches cap / 2;
* unseen-tail t: qverify.gate.unseen_tail.lower_and_p alone (the t bound that prices in a tail the sample missed);
* new w=.2 (gate): rule.measure as the gate runs it (unseen_tail.capped_bounds: betting at alpha / 5 or the
  unseen-tail t at 4 alpha / 5); new w=.5: the same with alpha split evenly.
With --plan, the default plan's looks (rounds of 150 kld items at LookLevels' nominal levels, as the budgeted gate
decides each look): P(PASS by the last look) for old betting, t and the gate's bound.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from qverify.gate import betting, unseen_tail
from qverify.gate.bounds import paired_bounds
from qverify.gate.rule import Evidence, measure
from qverify.suites.kld import KLD_CAP
from tests.synth import KL_SELF, KL_TOL, kl_draw, kl_mean_for, kl_tail_sample

ALPHA = 0.05
LIGHT, TIGHT = 0.66, 0.25  # log-scale SDs of the light candidate models
LATER_SKIP = {"light p=0.0025", "light p=0.005", "light p=0.02", "tight p=0.0025", "tight p=0.02", "tight p=0.005 at=0.049",
              "tight p=0.01 at=0.049", "tight p=0.005 at=0.074", "light p=0.005 own=0", "light p=0.0025 own=0"}  # after
# the first n, the tail rows that came out furthest below the level (the run's time on a shared 2-core box)


def sample(model: str, excess: float, n: int, trials: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(own, candidate) per-item capped KL, trials x n: "lognormal 2.0", "pareto 2.5" (tests.synth.kl_draw, the
    issue-29 rows) or "light" / "tight" with an optional " p=0.01" (a share at the cap), " at=0.074" (that share at
    this KL instead) and " own=0" (tests.synth.kl_tail_sample)."""
    words = model.split()
    fam, opts = words[0], dict(w.split("=") for w in words[1:] if "=" in w)
    if fam in ("light", "tight"):
        height = float(opts["at"]) if "at" in opts else None
        return kl_tail_sample(LIGHT if fam == "light" else TIGHT, float(opts.get("p", 0.0)), excess, n, trials, rng,
                              "own" in opts, height)
    own = np.minimum(rng.gamma(0.5, KL_SELF / 0.5, (trials, n)), KLD_CAP)
    cand = kl_draw(fam, float(words[1]), kl_mean_for(fam, float(words[1]), excess), (trials, n), rng)
    return own, np.minimum(cand, KLD_CAP)


def _bet_p(d: np.ndarray, c: float, prior: float, alpha: float = ALPHA) -> np.ndarray:
    """betting.p_value at the margin with another capital share c and prior (module constants swapped for the call)."""
    old = betting.CAP, betting._PRIOR_VAR
    betting.CAP, betting._PRIOR_VAR = c, prior
    try:
        return betting.p_value(d / KLD_CAP, -KL_TOL / KLD_CAP, alpha)
    finally:
        betting.CAP, betting._PRIOR_VAR = old


def passes(own: np.ndarray, cand: np.ndarray) -> dict[str, np.ndarray]:
    """PASS per trial under each construction."""
    ev = Evidence("kld/kld", "lower", KL_TOL, cand - own, bounded=True, scale=KLD_CAP, always_exact=True)
    d = own - cand  # oriented: higher is better
    bet_p = betting.p_value(d / KLD_CAP, -KL_TOL / KLD_CAP, ALPHA)  # the rule before: betting alone
    t = paired_bounds(d, KL_TOL, ALPHA, bounded=True, scale=KLD_CAP, always_exact=False).lower > -KL_TOL
    out = {"old betting": bet_p < ALPHA, "t": t, "bet c=.99/prior": _bet_p(d, 0.99, 0.01) < ALPHA}
    c = own - own.mean(axis=-1, keepdims=True)
    kurt = (c ** 4).mean(-1) / np.maximum((c ** 2).mean(-1), 1e-30) ** 2 - 3
    light_own = (kurt < 20) & (own.max(-1) < KLD_CAP / 2)
    out["self-KL regime"] = np.where(light_own, t, bet_p < ALPHA)
    no_tail = (cand - own).max(-1) < KLD_CAP / 2
    t_part = paired_bounds(d, KL_TOL, ALPHA * 0.8, bounded=True, scale=KLD_CAP, always_exact=False)
    out["t if no tail w=.2"] = (_bet_p(d, betting.CAP, betting._PRIOR_VAR, ALPHA * 0.2) < ALPHA * 0.2) | (
        no_tail & (t_part.lower > -KL_TOL))
    out["unseen-tail t"] = unseen_tail.lower_and_p(d, KL_TOL, ALPHA, KLD_CAP)[1] < ALPHA
    out["new w=.2 (gate)"] = measure(ev, ALPHA).lower > -KL_TOL
    out["new w=.5"] = _new_pass(d, ALPHA, 0.5)
    return out


def _new_pass(d: np.ndarray, alpha: float, bet_share: float = unseen_tail.BET_SHARE) -> np.ndarray:
    """unseen_tail.capped_pass's PASS (p_pass < alpha) from its two p-values, without the betting lower bound's
    bisection (the same event: tests/gate/test_kld_tails.py checks L > -tol iff p_pass < alpha)."""
    bet = betting.p_value(d / KLD_CAP, -KL_TOL / KLD_CAP, alpha * bet_share) < alpha * bet_share
    return bet | (unseen_tail.lower_and_p(d, KL_TOL, alpha * (1 - bet_share), KLD_CAP)[1] < alpha * (1 - bet_share))


def rates(model: str, excess: float, n: int, trials: int, rng: np.random.Generator, chunk: int = 2000) -> dict:
    tot: dict[str, float] = {}
    for start in range(0, trials, chunk):
        own, cand = sample(model, excess, n, min(chunk, trials - start), rng)
        for k, v in passes(own, cand).items():
            tot[k] = tot.get(k, 0.0) + float(v.sum())
    return {k: v / trials for k, v in tot.items()}


def plan_rates(model: str, excess: float, trials: int, rng: np.random.Generator, first: int = 150,
               chunk: int = 1000) -> dict:
    """P(kld/kld PASS by the last look) and the mean look of PASS at the default plan's looks (rounds of `first` kld
    items at LookLevels' nominal levels, as the budgeted gate decides each look), for betting, t and the tuned bet."""
    from gate_oc_sequence import default_rounds

    from qverify.gate.boundaries import nominal_levels

    looks = default_rounds()
    levels = nominal_levels(tuple(float(j) for j in range(1, looks + 1)), ALPHA)
    names = ("old betting", "t", "new (gate)")
    at = {k: [] for k in names}
    for start in range(0, trials, chunk):
        own, cand = sample(model, excess, first * looks, min(chunk, trials - start), rng)
        d = own - cand
        hit = {k: np.zeros(len(d), int) for k in names}
        for j, lv in enumerate(levels, 1):
            x = d[:, :first * j]
            ok = {"old betting": betting.p_value(x / KLD_CAP, -KL_TOL / KLD_CAP, lv) < lv,
                  "t": paired_bounds(x, KL_TOL, lv, bounded=True, scale=KLD_CAP).lower > -KL_TOL,
                  "new (gate)": _new_pass(x, lv)}
            for k in names:
                hit[k][(hit[k] == 0) & ok[k]] = j
        for k in names:
            at[k].append(hit[k])
    out = {}
    for k in names:
        a = np.concatenate(at[k])
        out[k] = f"{np.mean(a > 0):.4f} ({np.mean(a[a > 0]):.1f})" if (a > 0).any() else "0.0000 (-)"
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=4000, help="trials per power rate")
    ap.add_argument("--level-trials", type=int, default=10000, help="trials per rate at the margin (excess = tol)")
    ap.add_argument("--n", type=int, nargs="+", default=[150, 300])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="only the power rows")
    ap.add_argument("--lean", action="store_true", help="skip the tail rows furthest below the level at every n")
    ap.add_argument("--plan", type=int, default=0, help="trials per rate at the margin of the default-plan rows "
                    "(0: none; power rows take --trials)")
    a = ap.parse_args()
    rng = np.random.default_rng(a.seed)
    heavy = ["lognormal 1.0", "lognormal 2.0", "pareto 2.5", "pareto 3.5"]
    tails = [f"{m} p={p}" for m in ("light", "tight") for p in (0.0025, 0.005, 0.01, 0.02)]
    tails += [f"tight p={p} at={v}" for v in (0.049, 0.074) for p in (0.005, 0.01)]
    rows = [(m, e, a.trials) for m in ("light own=0", "light") for e in (0.8, 0.9, 0.0)]
    rows += [("tight", e, a.trials) for e in (0.9, 0.95)]
    rows += [("light p=0.007 own=0", e, a.trials) for e in (0.5, 0.7)]  # one item in 150 at the cap: what c costs
    rows += [(m, e, a.trials) for m in ("lognormal 2.0", "pareto 2.5") for e in (0.0, 0.5)]  # heavy builds' power
    if not a.quick:
        rows += [(m, 1.0, a.level_trials) for m in ["light own=0", "light", "tight"] + heavy + tails]
        rows += [(f"{m} own=0", 1.0, a.level_trials) for m in tails]
    print(f"# kld/kld, one fixed look, alpha {ALPHA}, tol {KL_TOL}, cap {KLD_CAP}; P(PASS) per construction; "
          f"SE of a rate near 0.05 at 10,000 trials: 0.0022 (level target <= 0.05 + 2 SE = 0.0544)\n")
    names = None
    for n in a.n:
        for model, e, trials in rows if n == a.n[0] and not a.lean else [r for r in rows if r[0] not in LATER_SKIP]:
            t0 = time.time()
            r = rates(model, e * KL_TOL, n, trials, rng)
            if names is None:
                names = list(r)
                print("| model | n | excess / tol | trials | " + " | ".join(names) + " |")
                print("|---|---|---|---|" + "---|" * len(names))
            print(f"| {model} | {n} | {e} | {trials} | " + " | ".join(f"{r[k]:.4f}" for k in names) + " |",
                  f"<!-- {time.time() - t0:.0f}s -->" if a.quick else "", flush=True)
    if a.plan:  # rounds of 150, as the default plan's
        print("\n# the default plan's looks (rounds of 150 kld items, LookLevels' nominal levels): P(PASS by the last "
              "look) (mean look of PASS)\n")
        print("| model | excess / tol | trials | old betting | t | new (gate) |\n|---|---|---|---|---|---|")
        plan = [("light own=0", e, a.trials // 2) for e in (0.9, 0.95)]
        plan += [(m, 1.0, a.plan) for m in ("light own=0", "tight p=0.01", "light p=0.01 own=0", "pareto 2.5")]
        for model, e, trials in plan:
            r = plan_rates(model, e * KL_TOL, trials, rng)
            print(f"| {model} | {e} | {trials} | {r['old betting']} | {r['t']} | {r['new (gate)']} |", flush=True)


if __name__ == "__main__":
    main()
