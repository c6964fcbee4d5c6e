"""The damage dial: how the shared-expert noise scale sigma maps to KL and to each suite's score drop.

    python benchmarks/damage_dial.py --sigmas 0.25,0.5,1,2 --suites kld,coding,toolcall --limit 60 \\
        --replicates 2 [--workdir /tmp/dial] [--json dial.json]

For each sigma: a control recipe (bf16 + corrupt.shared_expert_noise = sigma, seed 0) is built,
evaluated in its own server session (a separate launch) on the same held-out items as the bf16
baseline, and gated; the table prints each metric's Delta with its one-sided bounds. Every row
is ONE build and ONE server session per side: it says how big the damage is, not how often the
gate catches it (that is benchmarks/gate_oc.py). With more sessions per sigma (--seeds 0,1,2:
independently noised builds of the same size) the spread between builds shows too.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

from qverify.config import QVerifyConfig

RECIPE = """description: "Control (damage dial): shared-expert noise {sigma} x RMS, seed {seed}."
changes: ["shared experts: w += N(0, ({sigma} rms(w))^2), seed {seed}"]
control: true
serving:
  kv_cache_dtype: auto
corrupt:
  shared_expert_noise: {sigma}
  seed: {seed}
"""


def main(argv: list[str] | None = None) -> int:
    from qverify.gate.gate import run_gate
    from qverify.pipeline import evaluate_build
    from qverify.quantize.build import build
    from qverify.workdir import Workdir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sigmas", default="0.25,0.5,1,2")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--suites", default="kld,coding,toolcall")
    ap.add_argument("--limit", type=int, default=60)
    ap.add_argument("--replicates", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    wd = Workdir.at(a.workdir or tempfile.mkdtemp(prefix="dial-"))
    suites = a.suites.split(",")
    recipes_dir = wd.root / "dial-recipes"
    recipes_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    base = build("bf16", workdir=wd.root).manifest.build_id
    evaluate_build(wd, base, suites, replicates=a.replicates, limit=a.limit, show_progress=False)
    rows = []
    print("| sigma | seed | metric | baseline | candidate | Δ | one-sided 95% bounds | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for sigma in [float(x) for x in a.sigmas.split(",")]:
        for seed in [int(x) for x in a.seeds.split(",")]:
            path = recipes_dir / f"noise_{sigma:g}_{seed}.yaml"
            path.write_text(RECIPE.format(sigma=sigma, seed=seed))
            cand = build(str(path), workdir=wd.root).manifest.build_id
            evaluate_build(wd, cand, suites, replicates=a.replicates, limit=a.limit, show_progress=False)
            rep = run_gate(wd, base, [cand], suites, QVerifyConfig(), write=False)
            for m in rep.candidates[0].metrics:
                if not m.gated:
                    continue
                rows.append({"sigma": sigma, "seed": seed, "metric": m.metric, "baseline": m.baseline_mean,
                             "candidate": m.candidate_mean, "delta": m.delta, "lo": m.ci_low, "hi": m.ci_high,
                             "verdict": m.verdict, "n_items": m.n_items, "sessions_per_side": 1})
                print(f"| {sigma:g} | {seed} | {m.metric} | {m.baseline_mean:.4f} | {m.candidate_mean:.4f} | "
                      f"{m.delta:+.4f} | [{m.ci_low:+.4f}, {m.ci_high:+.4f}] | {m.verdict} |", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))
    print(f"# {time.time() - t0:.0f} s; {a.limit} items x {a.replicates} replicates per suite; one server session "
          f"per build", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
