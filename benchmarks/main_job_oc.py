#!/usr/bin/env python
"""The main job's own design, simulated: P(gate PASS | all Δ=0) and P(gate FAIL | toolcall −2 tol).

    OMP_NUM_THREADS=1 python benchmarks/main_job_oc.py [--trials 10000] [--family 4,14]

scripts/main-job.toml gates in rounds of 200 items × 3 replicates with 4 looks planned (200, 400, 600, 800 items
per undecided suite; about what 10 minutes run on an idle 2-core box). #14's target: within the main job's budget,
P(PASS | Δ = 0) >= 0.8 and P(FAIL | Δ = −2 tol) >= 0.8. This runs benchmarks/gate_oc.py's whole-gate model
(four suites: toolcall-like T=0.6 "noisy", "stable", coding at its ceiling, a KL distance; one gated metric each)
under exactly that design, with FAIL family-wise over `--family` gated metrics (the first Holm step: the main job
gates ~14 metrics once the verifier's hygiene rates and the longctx buckets are counted; 4 is the model's own).
Every rate is the share of `--trials` independent simulated gates; a fixed design at 800 items is printed beside it.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from oc_models import ALPHA, GATE_SUITES, design_levels, whole_gate  # noqa: E402  (one model, one definition)

from qverify.gate.boundaries import SPEND_GAMMA  # noqa: E402

MAIN_JOB_LOOKS = [200, 400, 600, 800]  # scripts/main-job.toml: limit 200, looks 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10_000)
    ap.add_argument("--family", default=f"{len(GATE_SUITES)},14", help="FAIL family sizes to show (comma-separated)")
    ap.add_argument("--seed", type=int, default=2026)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    print(f"# the main job's design: looks at {MAIN_JOB_LOOKS} items × 3 replicates, HSD(γ {SPEND_GAMMA:g}), "
          f"α {ALPHA}; {args.trials} independent simulated gates per cell")
    print("| design | FAIL family | P(PASS \\| all Δ=0) | P(FAIL \\| all Δ=0) | P(FAIL \\| toolcall −2 tol) | "
          "P(PASS \\| toolcall −tol) | median requests (Δ=0) | targets met |")
    print("|---|---|---|---|---|---|---|---|")
    t0 = time.time()
    for family in (int(f) for f in args.family.split(",")):
        seq = MAIN_JOB_LOOKS, design_levels(MAIN_JOB_LOOKS, ALPHA, SPEND_GAMMA, family)
        fix = [MAIN_JOB_LOOKS[-1]], ([ALPHA], [ALPHA / family])
        for name, (looks, levels) in (("sequential (main job)", seq), ("fixed at 800", fix)):
            null = whole_gate({}, args.trials, rng, looks, levels)
            bad = whole_gate({"toolcall": -2.0}, args.trials, rng, looks, levels)
            edge = whole_gate({"toolcall": -1.0}, args.trials, rng, looks, levels)
            ok = null["PASS"] >= 0.8 and bad["FAIL"] >= 0.8
            print(f"| {name} | {family} | {null['PASS']:.3f} | {null['FAIL']:.3f} | {bad['FAIL']:.3f} | "
                  f"{edge['PASS']:.3f} | {null['median_requests']:.0f} | {'yes' if ok else 'no'} |", flush=True)
    print(f"\n({time.time() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
