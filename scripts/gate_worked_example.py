"""Regenerates the gate's worked example (docs/gate.md, "Worked example"): synthetic coding runs
written through the real RunStore and gated by the real run_gate. Prints the markdown table.

    python scripts/gate_worked_example.py
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from qverify.config import QVerifyConfig
from qverify.gate import run_gate
from tests import synth


def main() -> None:
    rng = np.random.default_rng(7)
    n = 400
    right = (rng.random(n) < 0.75).astype(float)
    p = np.where(rng.random(n) < 0.10, 0.5, right)  # 10% of items flip run to run
    q = p.copy()
    q[np.flatnonzero(p == 1.0)[:4]] = 0.0  # fp8kv: 4 always-right items now always wrong (-1 point)
    r = p.copy()
    r[np.flatnonzero(p == 1.0)[:32]] = 0.0  # broken: 32 of them (-8 points)
    wd = Path(tempfile.mkdtemp())
    # replicate k of item i has the same seed on every build; a nondeterministic stack reproduces the
    # baseline's draw only 70% of the time (the rest is fresh: batch composition, kernel choice)
    u = rng.random((n, 3))
    for b, pp in {"bf16": p, "rebuild": p, "fp8kv": q, "broken": r}.items():
        draw = u if b == "bf16" else np.where(rng.random((n, 3)) < 0.7, u, rng.random((n, 3)))
        synth.write_build(wd / "builds", b, b)
        synth.write_run(wd / "runs", b, "coding", synth.results("coding", synth.item_ids("coding", n),
                                                                {"pass@1": (draw < pp[:, None]).astype(float)}))
    report = run_gate(wd, "bf16", ["rebuild", "fp8kv", "broken"], suites=["coding"], config=QVerifyConfig())
    print("| candidate | Δ | one-sided 95% bounds [L, U] | SE | run-to-run SD | p (FAIL, Holm) | flips −/+ | verdict |")
    print("|---|---|---|---|---|---|---|---|")
    for c in report.candidates:
        m = c.metrics[0]
        p_fail = "—" if m.p_adjusted is None else f"{m.p_adjusted:.2g}"
        print(f"| {c.build_id} | {m.delta:+.4f} | [{m.ci_low:+.4f}, {m.ci_high:+.4f}] | {m.details['se']:.4f} | "
              f"{m.noise_band:.4f} | {p_fail} | {m.flips.get('regressed', 0):.0f}/{m.flips.get('improved', 0):.0f} | "
              f"**{m.verdict}**: {m.reason} |")


if __name__ == "__main__":
    main()
