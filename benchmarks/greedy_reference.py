"""greedy/match against its reference (the candidate's twin: its target with the baseline's drafter) and, for
contrast, against the baseline (the comparison the gate made before), on the same runs.

    OMP_NUM_THREADS=1 python benchmarks/greedy_reference.py --limit 250 --replicates 2 \\
        [--recipes fp8drafter,fp8kv_nvfp4shared_fp8drafter] [--workdir /tmp/greedyref]

What `qverify gate --recipe R --suites greedy --limit N --replicates K` does, for several recipes at once:
builds bf16 and each recipe (the embedded default model), composes the twins, evaluates every build on
the greedy suite (one server session per build) and gates. Prints one row per (candidate, reference):
greedy/match's mean, Δ with its one-sided bounds, and the verdict. Resumable (builds and runs are reused).
"""

from __future__ import annotations

import argparse
import tempfile
import time

from qverify.config import QVerifyConfig


def main(argv: list[str] | None = None) -> int:
    from qverify.gate.gate import gate_candidate, run_gate
    from qverify.gate.loader import load
    from qverify.pipeline import ensure_builds
    from qverify.rounds import gate_builds
    from qverify.workdir import Workdir

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recipes", default="fp8drafter,fp8kv_nvfp4shared_fp8drafter")
    ap.add_argument("--limit", type=int, default=250)
    ap.add_argument("--replicates", type=int, default=2)
    ap.add_argument("--workdir", default=None)
    a = ap.parse_args(argv)
    wd = Workdir.at(a.workdir or tempfile.mkdtemp(prefix="greedyref-")).ensure()
    cfg = QVerifyConfig(suites=["greedy"], limit=a.limit, replicates=a.replicates, report=False)
    t0 = time.time()
    base, cands = ensure_builds(wd, cfg, "bf16", a.recipes.split(","))
    gate_builds(wd, cfg, base, cands, ["greedy"], None, show_progress=False, evaluate_fixed=True)  # evaluates (twins too)
    print(f"built and evaluated in {time.time() - t0:.0f}s; workdir {wd.root}\n")
    report = run_gate(wd, base, cands, ["greedy"], cfg)
    print(f"greedy suite: {a.limit} items x {a.replicates} replicates per build, one server session per build\n")
    print("| candidate | compared with | greedy/match (reference self / candidate) | Δ | one-sided 95% bounds | items | verdict |")
    print("|---|---|---|---|---|---|---|")
    base_run = load(wd.runs, base, "greedy")
    for c in report.candidates:
        rows = [(next(m for m in c.metrics if m.metric == "greedy/match"), None)]
        if c.compared_with:  # the old comparison, for contrast: the same candidate runs against the baseline
            old = gate_candidate(c.build_id, c.recipe, {"greedy": base_run}, {"greedy": load(wd.runs, c.build_id, "greedy")},
                                 cfg.thresholds, cfg.alpha)
            rows.append((old.metrics[0], f"{base} (bf16: the old comparison)"))
        for m, who in rows:
            who = who or m.details.get("reference", "-") + (" (twin)" if c.compared_with else " (baseline)")
            print(f"| {c.recipe} | {who} | {m.baseline_mean:.3f} / {m.candidate_mean:.3f} | {m.delta:+.4f} | "
                  f"[{m.ci_low:+.4f}, {m.ci_high:+.4f}] | {m.n_items} | {m.verdict if m.gated else 'not gated'} |")
    print(f"\ngate {report.gate_id}: {report.verdict} ({time.time() - t0:.0f}s in all)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
