"""qverify gate: ship / no-ship of a lossy build against the serving stack's run-to-run noise.

metrics   gate-metric declarations (data) and qverify.toml rules
stats     noise model, paired bootstrap, band, MDE, Holm (pure)
pairwise  flips, McNemar, K2VV trigger-F1 + floor, KL matrices (pure)
decide    the verdict rule, per metric and per build
integrity refusals: incomplete runs, mismatched items/versions/sampling, build ids
loader / assemble   runs -> per-metric paired matrices
gate      run_gate -> GateReport, gates/<id>/gate.json
render    the terminal table
"""

from qverify.gate.gate import exit_code, gate_candidate, run_gate, write_report

__all__ = ["exit_code", "gate_candidate", "run_gate", "write_report"]
