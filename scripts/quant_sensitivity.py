#!/usr/bin/env python
"""Quantization-sensitivity table of the embedded model: every evaluated build's scores and gate verdict.

    python scripts/quant_sensitivity.py --workdir .qverify [--write-card]

Reads `<workdir>/builds/*/build.json` and their runs, prints a markdown table (primary metric per
suite: mean over replicates and the replicate range; longctx per length bucket), gates every
non-bf16 build against the bf16 one, and with --write-card replaces the model card's
"Quantization sensitivity" section with the table.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CARD = ROOT / "qverify/assets/qverify-tiny/README.md"
COLUMNS = [("coding", "pass@1"), ("toolcall", "exact_call"), ("toolcall", "trigger"), ("longctx", "accuracy"),
           ("longctx", "accuracy@128"), ("longctx", "accuracy@512"), ("longctx", "accuracy@1024"),
           ("verifier", "schema_accuracy")]


def cell(run, key: str) -> str:
    m = run.scores.get(key) if run.exists else None
    if m is None or np.isnan(m).all():
        return "–"
    reps = [float(np.nanmean(c)) for c in m.T if not np.isnan(c).all()]
    if len(reps) == 1:
        return f"{reps[0]:.3f}"
    return f"{np.mean(reps):.3f} ({min(reps):.2f}–{max(reps):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=Path(".qverify"))
    ap.add_argument("--write-card", action="store_true")
    args = ap.parse_args()
    from qverify.gate.gate import run_gate
    from qverify.gate.loader import load
    from qverify.workdir import Workdir

    wd = Workdir.at(args.workdir)
    builds = {}
    for bj in sorted(wd.builds.glob("*/build.json")):
        m = json.loads(bj.read_text())
        builds[m["build_id"]] = m["recipe"]
    base = next((b for b, r in builds.items() if r == "bf16"), None)
    order = sorted(builds, key=lambda b: (builds[b] != "bf16", builds[b]))
    head = ["recipe", "reps"] + [f"{s} {k}" for s, k in COLUMNS] + ["KL vs bf16 (nats)", "gate vs bf16"]
    rows = []
    for b in order:
        runs = {s: load(wd.runs, b, s) for s in {s for s, _ in COLUMNS}}
        if not any(r.exists for r in runs.values()):
            continue
        reps = max(len(r.replicates) for r in runs.values())
        verdict, kl = "baseline", "–"
        if b != base and base:
            suites = [s for s in ("coding", "toolcall", "longctx", "verifier", "kld", "greedy")
                      if (wd.runs / b / s).exists() and (wd.runs / base / s).exists()]
            rep = run_gate(wd, base, [b], suites=suites, write=False)
            c = rep.candidates[0]
            failed = [m.metric for m in c.metrics if m.verdict == "FAIL" and m.gated]
            verdict = c.verdict + (f" ({', '.join(failed[:3])}{', …' if len(failed) > 3 else ''})" if failed else "")
            kl = next((f"{m.candidate_mean:.4f}" for m in c.metrics if m.metric == "kld/kld"), "–")
        rows.append([builds[b], str(reps)] + [cell(runs[s], k) for s, k in COLUMNS] + [kl, verdict])
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows])
    print(table)
    if args.write_card:
        text = CARD.read_text()
        start = text.index("## Quantization sensitivity")
        end = text.find("\n## ", start + 3)
        section = ("## Quantization sensitivity\n"
                   f"Measured with `qverify eval` (held-out items, each suite's gating sampling, replicates as shown; mean "
                   f"and range over replicates) and `qverify gate` against bf16, by `scripts/quant_sensitivity.py`:\n\n{table}\n")
        CARD.write_text(text[:start] + section + (text[end:] if end >= 0 else ""))
        print(f"wrote {CARD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
