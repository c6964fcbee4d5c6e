"""Gate statistical efficiency: requests needed to reach an MDE of 2 points, paired vs unpaired.

For each suite's primary metric, from per-item success probabilities p_i (the built-in model
of gate_calibration.py, or fitted to real runs with --workdir/--baseline):

    paired   (same items, same seeds, Δ per item):  Var(Δ̄) = 2·E[p(1-p)] / (n·K)
    unpaired (two independent item samples):         Var(Δ̄) = 2·(Var(p) + E[p(1-p)]/K) / n

and MDE = 2.8·SE (α = 0.05 two-sided, 80% power; Miller 2024). Requests = 2 builds × n × K.
Pairing removes the between-item variance Var(p), which dominates whenever items are mostly
always-right or always-wrong: that is why the gate pairs by item. A Monte Carlo check draws
replicates and compares the empirical SD of Δ̄ with the formula (A/A: the candidate has the
baseline's p_i; a real regression adds item-level variance on top).

    python benchmarks/gate_efficiency.py                 # built-in model
    python benchmarks/gate_efficiency.py --workdir .qverify --baseline <bf16 build id>
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gate_calibration import default_models, fitted  # noqa: E402

Z = 2.8  # z_{1-α/2} + z_{power} = 1.96 + 0.84
PRIMARY = {"coding": "pass@1", "toolcall": "exact_call", "longctx": "accuracy", "verifier": "tool_call_finish"}


def variances(p: np.ndarray) -> tuple[float, float]:
    """(between-item variance Var(p), mean within-item variance E[p(1-p)])."""
    return float(np.var(p)), float(np.mean(p * (1 - p)))


def requests_needed(between: float, within: float, k: int, mde: float, paired: bool) -> int:
    per_item_var = 2 * within / k if paired else 2 * (between + within / k)
    n = int(np.ceil((Z / mde) ** 2 * per_item_var))
    return 2 * max(n, 1) * k


def monte_carlo(p: np.ndarray, k: int, trials: int, rng: np.random.Generator) -> tuple[float, float]:
    """Empirical SD of Δ̄ (paired, unpaired) for n = len(p) items, A/A."""
    n = len(p)
    paired, unpaired = [], []
    for _ in range(trials):
        b = (rng.random((n, k)) < p[:, None]).mean(axis=1)
        c = (rng.random((n, k)) < p[:, None]).mean(axis=1)
        paired.append(c.mean() - b.mean())
        qb, qc = rng.choice(p, n), rng.choice(p, n)  # each build on its own sample of items
        unpaired.append((rng.random((n, k)) < qc[:, None]).mean() - (rng.random((n, k)) < qb[:, None]).mean())
    return float(np.std(paired)), float(np.std(unpaired))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path)
    ap.add_argument("--baseline", help="baseline build id whose runs give the per-item probabilities")
    ap.add_argument("--mde", type=float, default=0.02, help="target minimum detectable effect (default 2 points)")
    ap.add_argument("--trials", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    if args.workdir and args.baseline:
        from qverify.gate.loader import load

        models = fitted({s: load(args.workdir / "runs", args.baseline, s) for s in PRIMARY
                         if (args.workdir / "runs" / args.baseline / s).exists()})
        source = f"fitted to {args.baseline}'s runs"
    else:
        models = default_models(rng)
        source = "built-in model (gate_calibration.default_models)"
    print(f"# Requests to reach MDE {args.mde:.3f} ({source})\n")
    print("| suite | metric | items | Var(p) between | E[p(1-p)] within | K | paired requests | unpaired requests | "
          "unpaired / paired | MC SD paired (formula) | MC SD unpaired (formula) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for suite, key in PRIMARY.items():
        if suite not in models or key not in models[suite].p:
            continue
        p = models[suite].p[key]
        between, within = variances(p)
        for k in (1, 3, 5):
            pr = requests_needed(between, within, k, args.mde, paired=True)
            ur = requests_needed(between, within, k, args.mde, paired=False)
            sd_p, sd_u = monte_carlo(p, k, args.trials, rng)
            n = len(p)
            f_p, f_u = np.sqrt(2 * within / (n * k)), np.sqrt(2 * (between + within / k) / n)
            print(f"| {suite} | {key} | {n} | {between:.4f} | {within:.4f} | {k} | {pr:,} | {ur:,} | {ur / pr:.1f}× | "
                  f"{sd_p:.4f} ({f_p:.4f}) | {sd_u:.4f} ({f_u:.4f}) |")
    print("\nPaired requests do not depend on K: with no item-level change, only the total number of sampled "
          "answers matters, so items and replicates trade one for one. Unpaired grows with K because the "
          "between-item variance is paid per item, not per request.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
