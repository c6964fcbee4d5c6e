"""kld/kld's reference is the baseline's own run-to-run KL (issue 29, minor items), on runs built in memory through
synth.results and loader.from_results (what loader.load reads), gated by the real gate_candidate."""

from __future__ import annotations

import numpy as np

from qverify.gate.assemble import SELF_KL_WARN
from qverify.gate.gate import gate_candidate
from qverify.gate.loader import RunData, from_results
from qverify.gate.render import compact_lines
from qverify.models import GateReport
from tests import synth

N = 40


def _kld_run(build: str, logits: np.ndarray, k: int, noise: float, rng: np.random.Generator) -> RunData:
    lps = synth.logprob_runs(logits, k, run_noise=noise, shift=0.0, rng=rng)
    res = synth.results("kld", synth.item_ids("kld", len(logits)), {"has_logprobs": np.ones((len(logits), k))},
                        logprobs=lps)
    return from_results(build, "kld", None, res, keep_logprobs=True)


def _gate(base: RunData, cand: RunData) -> GateReport:
    c = gate_candidate("cand", "cand", {"kld": base}, {"kld": cand}, {})
    return GateReport(gate_id="g", baseline="base", baseline_recipe="base", verdict=c.verdict, candidates=[c])


def _kld(report: GateReport):
    return next(m for m in report.candidates[0].metrics if m.metric == "kld/kld")


def test_a_noisy_baselines_self_kl_is_reported_and_warned_about():
    """Logit noise 0.1 per run puts the baseline's own KL near 0.008 (over 25% of tol 0.01); 0.002 near 0.0001.
    The warning is in gate.json (details) and in the rendered report whatever the verdict."""
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 2, (N, 8, 16))
    noisy = _gate(_kld_run("base", logits, 3, 0.1, rng), _kld_run("cand", logits, 3, 0.0, rng))
    m = _kld(noisy)
    assert m.details["baseline_self"] >= SELF_KL_WARN * m.tolerance
    assert "half" in m.details["warning"] and f"{m.details['baseline_self']:.3g}" in m.details["warning"]
    text = " ".join(compact_lines(noisy))
    assert "warning: kld/kld: the baseline's own run-to-run kld" in text
    quiet = _gate(_kld_run("base", logits, 3, 0.002, rng), _kld_run("cand", logits, 3, 0.002, rng))
    q = _kld(quiet)
    assert q.details["baseline_self"] < SELF_KL_WARN * q.tolerance and "warning" not in q.details
    assert "warning:" not in " ".join(compact_lines(quiet))


def test_kl_with_one_baseline_replicate_says_what_is_missing():
    """The baseline's own KL is over pairs of its runs: one replicate has none. The refusal says so and how to get
    a second (it used to read "no item has logprobs on both sides", though every item had logprobs)."""
    rng = np.random.default_rng(1)
    logits = rng.normal(0, 2, (N, 8, 16))
    r = _gate(_kld_run("base", logits, 1, 0.0, rng), _kld_run("cand", logits, 3, 0.0, rng))
    m = _kld(r)
    assert m.verdict == "INCONCLUSIVE" and r.candidates[0].verdict == "INCONCLUSIVE"
    assert "pairs of its runs" in m.reason and "1 replicate" in m.reason
    assert "qverify eval base --suites kld --replicates 2" in m.reason and "both sides" not in m.reason
