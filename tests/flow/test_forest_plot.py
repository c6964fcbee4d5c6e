"""A bound a rounding error inside Δ (gate.json of a real kld FAIL on the kimi_k25 fixture: Δ 0.10000000000000002,
upper bound 0.1) made matplotlib refuse the forest plot, and the FAIL gate lost its release review."""

from __future__ import annotations

from types import SimpleNamespace

from qverify.models import CandidateReport, GateReport, MetricResult
from qverify.reports.plots import forest


def test_forest_takes_a_bound_a_rounding_error_inside_delta(tmp_path):
    m = MetricResult(metric="kld/kld", direction="lower", baseline_mean=0.0, candidate_mean=0.1,
                     delta=0.10000000000000002, ci_low=0.03260060204192996, ci_high=0.1, noise_band=0.0, tolerance=0.01,
                     mde=0.0, verdict="FAIL", reason="worse than the tolerance")
    gate = GateReport(gate_id="g", baseline="b", verdict="FAIL",
                      candidates=[CandidateReport(build_id="c", recipe="fp8kv_nvfp4shared", verdict="FAIL", metrics=[m])])
    assert forest(SimpleNamespace(gate=gate), tmp_path / "forest.png").is_file()
