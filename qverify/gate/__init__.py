"""qverify gate: ship / no-ship of a lossy build, with stated error rates (docs/gate.md).

metrics     gate-metric declarations (from each suite) and qverify.toml rules
design      the runner's design -> per-item paired differences (shared seeds, run pairs, F1 jackknife)
bounds      one-sided bounds: skew-corrected t + exact Clopper-Pearson on discordant items (pure)
betting     an exact bound on a bounded mean by betting (Waudby-Smith & Ramdas 2023) (pure)
unseen_tail a capped distance's bounds: betting, and for PASS a t bound that prices in an unseen tail (pure)
rule        PASS (non-inferiority, intersection-union) / FAIL (Holm) / INCONCLUSIVE, refusals (pure)
boundaries  group-sequential levels of planned looks: alpha spending on the looks' joint law (pure)
plan_size   the default request budget, sized from the suites' tolerances (pure)
budget      looks in rounds (a fixed gate: one look), resume (sequence.json); qverify/rounds.py runs it
pairwise    flips, McNemar, K2VV trigger-F1 floor, KL matrices, output signatures (pure)
looks       which reports were budgeted
ledger      every gate of a pair is a look of one sequence: alpha left after the earlier ones (runs/<cand>/gate-looks.jsonl)
errored     errored requests at their worst for PASS, their best for FAIL
reference   greedy/match's reference, found by content (twins)
integrity   refusals: incomplete runs, mismatched items/versions/sampling, build ids
loader / assemble   runs -> per-metric paired evidence
decide      decisions -> MetricResult rows
gate        run_gate: one look -> GateReport; write_report: gates/<id>/gate.json
render      the terminal tables
"""

from qverify.gate.gate import exit_code, gate_candidate, run_gate, write_report

__all__ = ["exit_code", "gate_candidate", "run_gate", "write_report"]
