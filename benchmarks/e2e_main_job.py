#!/usr/bin/env python
"""The main job on the embedded default, timed by stage: build bf16 + candidate, eval both, gate, report.

    python benchmarks/e2e_main_job.py [--recipe fp8kv_nvfp4shared] [--replicates 3] [--limit N] [--workdir DIR]

Runs in a fresh workdir (default: a temp dir) so nothing is reused; prints a table of stage
times and the verdict. Target: the whole job in ≤ 10 minutes on a 2-core CPU box.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from datetime import datetime
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", default="fp8kv_nvfp4shared")
    ap.add_argument("--replicates", type=int, default=None, help="default: qverify.toml's default")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--no-report", action="store_true")
    args = ap.parse_args()

    from qverify.config import QVerifyConfig
    from qverify.gate.gate import run_gate
    from qverify.pipeline import EvalSpec, evaluate_build
    from qverify.quantize.build import build
    from qverify.workdir import Workdir

    wd = Workdir.at(args.workdir or tempfile.mkdtemp(prefix="qverify-e2e-")).ensure()
    cfg = QVerifyConfig(candidates=[args.recipe])
    if args.replicates:
        cfg.replicates = args.replicates
    if args.limit:
        cfg.limit = args.limit
    stages: list[tuple[str, float]] = []
    t_all = time.perf_counter()

    def timed(name, fn):
        t = time.perf_counter()
        out = fn()
        stages.append((name, time.perf_counter() - t))
        print(f"{name:32s} {stages[-1][1]:7.1f} s", flush=True)
        return out

    base = timed("build bf16", lambda: build(cfg.baseline, workdir=wd.root))
    cand = timed(f"build {args.recipe}", lambda: build(args.recipe, workdir=wd.root))
    for b in (base, cand):
        timed(f"eval {b.manifest.recipe}", lambda b=b: evaluate_build(
            wd, b.manifest.build_id, spec=EvalSpec.from_config(cfg), show_progress=False))
    report = timed("gate", lambda: run_gate(wd, base.manifest.build_id, [cand.manifest.build_id], cfg.suites, cfg))
    if not args.no_report:
        from qverify.reports.upload import upload_gate

        timed("report (MLflow sqlite)", lambda: upload_gate(wd.root, report.gate_id))
    total = time.perf_counter() - t_all
    print(f"{'TOTAL':32s} {total:7.1f} s  ({total / 60:.1f} min)")
    c = report.candidates[0]
    mdes = {m.metric: round(m.mde, 3) for m in c.metrics if m.gated}
    print(f"verdict {c.verdict}; replicates {cfg.replicates}; MDE per gated metric: {json.dumps(mdes)}")
    for m in c.metrics:
        if m.gated:
            print(f"  {m.metric:34s} base {m.baseline_mean:.3f} cand {m.candidate_mean:.3f} Δ {m.delta:+.3f} "
                  f"MDE {m.mde:.3f} tol {m.tolerance:.3f} {m.verdict}")
    from qverify.evals.store import RunStore

    for b in (base, cand):  # per-suite eval time from the run manifests' timestamps
        times = []
        for suite in cfg.suites:
            man = RunStore(wd.run_dir(b.manifest.build_id, suite)).read_manifest()
            if man and man.finished and man.started:
                secs = (datetime.fromisoformat(man.finished) - datetime.fromisoformat(man.started)).total_seconds()
                times.append(f"{suite} {secs:.0f}s")
        print(f"  eval {b.manifest.recipe}: {', '.join(times)}")
    print(f"machine: {platform.machine()} {platform.processor() or ''}, workdir {wd.root}")


if __name__ == "__main__":
    main()
