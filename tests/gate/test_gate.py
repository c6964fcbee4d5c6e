"""qverify gate end to end on synthetic runs with known effects, written through the real RunStore."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from qverify.config import MetricRule, QVerifyConfig
from qverify.errors import BadInput
from qverify.gate import exit_code, run_gate
from qverify.models import GateReport
from qverify.workdir import Workdir
from tests import synth

N, K = 300, 4


def _p_noisy(rng: np.random.Generator, n: int = N, unstable: float = 0.1) -> np.ndarray:
    """Mostly deterministic items (75% right), a fraction that flips run to run with p = 0.5."""
    right = (rng.random(n) < 0.75).astype(float)
    return np.where(rng.random(n) < unstable, 0.5, right)


def _degrade(p: np.ndarray, n_items: int) -> np.ndarray:
    """The candidate gets `n_items` of the always-right items always wrong."""
    q = p.copy()
    q[np.flatnonzero(p == 1.0)[:n_items]] = 0.0
    return q


def _put(wd: Path, build: str, suite: str, scores: dict[str, np.ndarray], ids: list[str] | None = None, **kw) -> None:
    if not (wd / "builds" / build / "build.json").exists():
        synth.write_build(wd / "builds", build, recipe=build)
    n = next(iter(scores.values())).shape[0]
    ids = ids or synth.item_ids(suite, n)
    synth.write_run(wd / "runs", build, suite, synth.results(suite, ids, scores), **kw)


def _verifier_scores(t: np.ndarray, k: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    calls = synth.bernoulli(t, k, rng)
    schema = np.where(calls == 1, synth.bernoulli(np.full(len(t), 0.97), k, rng), np.nan)
    return {"tool_call_finish": calls, "finish/tool_calls": calls, "finish/stop": 1 - calls, "schema_accuracy": schema,
            "hygiene/empty": synth.bernoulli(np.full(len(t), 0.01), k, rng)}


@pytest.fixture(scope="module")
def wd(tmp_path_factory) -> Path:
    wd = tmp_path_factory.mktemp("gate")
    rng = np.random.default_rng(42)
    # coding + toolcall: a noisy baseline, an A/A rerun, a small and a large regression
    p = _p_noisy(rng)
    q = _p_noisy(rng, unstable=0.05)
    for build, pc in {"base": p, "aa": p, "small": _degrade(p, 3), "large": _degrade(p, 45)}.items():
        _put(wd, build, "coding", {"pass@1": synth.bernoulli(pc, K, rng)})
        trig = synth.bernoulli(np.where(q > 0, 1.0, 0.97), K, rng)
        _put(wd, build, "toolcall", {"exact_call": synth.bernoulli(q, K, rng) * trig, "trigger": trig})
    # answers cut at max_tokens: an A/A candidate with 30% finish=length, and a broken one likewise
    cut = rng.random((N, K)) < 0.3
    synth.write_build(wd / "builds", "cut", recipe="cut")
    synth.write_build(wd / "builds", "cutbad", recipe="cutbad")
    synth.write_run(wd / "runs", "cut", "coding", synth.results("coding", synth.item_ids("coding", N),
                                                                {"pass@1": synth.bernoulli(p, K, rng)}, length=cut))
    synth.write_run(wd / "runs", "cutbad", "coding", synth.results(
        "coding", synth.item_ids("coding", N), {"pass@1": synth.bernoulli(_degrade(p, 45), K, rng)}, length=cut))
    # integrity: one suite all infra errors; another item set; a build.json for another build
    _put(wd, "errs", "coding", {"pass@1": synth.bernoulli(p, K, rng)})
    synth.write_run(wd / "runs", "errs", "toolcall", synth.results(
        "toolcall", synth.item_ids("toolcall", N), {"trigger": np.ones((N, K))}, errors=np.ones((N, K), bool)))
    _put(wd, "otheritems", "coding", {"pass@1": synth.bernoulli(p, K, rng)}, ids=synth.item_ids("other", N))
    synth.write_build(wd / "builds", "renamed", recipe="renamed", manifest_build_id="somethingelse")
    _put(wd, "renamed", "coding", {"pass@1": synth.bernoulli(p, K, rng)})
    # a deterministic baseline (identical replicates), small and large item-level regressions
    d = (rng.random(N) < 0.75).astype(float)
    for build, pc in {"det": d, "det_small": _degrade(d, 3), "det_large": _degrade(d, 36)}.items():
        _put(wd, build, "coding", {"pass@1": np.repeat(pc[:, None], 3, axis=1)})
    # too few items; too few items for the tolerance
    _put(wd, "tiny", "coding", {"pass@1": synth.bernoulli(p[:8], 3, rng)})
    _put(wd, "tiny2", "coding", {"pass@1": synth.bernoulli(p[:8], 3, rng)})
    pf = _p_noisy(rng, 40, unstable=0.5)
    _put(wd, "few", "longctx", {"accuracy": synth.bernoulli(pf, 3, rng)})
    _put(wd, "few2", "longctx", {"accuracy": synth.bernoulli(pf, 3, rng)})
    # verifier: trigger-F1 vs the baseline's runs; a candidate that stops calling tools on 40% of items;
    # a pair of builds that never call a tool (trigger-F1 undefined, schema_accuracy never emitted)
    t = np.where(rng.random(400) < 0.6, 1.0, 0.0)
    t = np.where(rng.random(400) < 0.1, 0.5, t)
    tn = np.where((t == 1.0) & (rng.random(400) < 0.4), 0.0, t)
    for build, tc in {"vbase": t, "vaa": t, "vnocall": tn, "vnone": 0 * t, "vnone2": 0 * t}.items():
        _put(wd, build, "verifier", _verifier_scores(tc, 3, rng))
    # kld: prompt logprobs; a deterministic baseline, a near and a far candidate; and a baseline with
    # tiny run-to-run noise (batch-composition rounding) against a candidate whose KL is small but far above it
    logits = rng.normal(0, 2, (80, 16, 16))  # the capped KL's exact bound needs ~60 items to PASS
    for build, shift, noise in (("kbase", 0.0, 0.0), ("knear", 0.05, 0.0), ("kfar", 1.5, 0.0),
                                ("knoisy", 0.0, 0.002), ("knoisy_near", 0.05, 0.002)):
        lps = synth.logprob_runs(logits, 3, run_noise=noise, shift=shift, rng=rng)
        synth.write_build(wd / "builds", build, recipe=build)
        synth.write_run(wd / "runs", build, "kld", synth.results("kld", synth.item_ids("kld", 80),
                                                                 {"has_logprobs": np.ones((80, 3))}, logprobs=lps))
    return wd


def _gate(wd: Path, base: str, cands: list[str], suites: list[str], **cfg) -> GateReport:
    return run_gate(wd, base, cands, suites=suites, config=QVerifyConfig(**cfg))


def _metric(report: GateReport, name: str, cand: int = 0):
    return next(m for m in report.candidates[cand].metrics if m.metric == name)


@pytest.mark.slow
def test_no_effect_passes_small_never_fails_large_fails(wd):
    r = _gate(wd, "base", ["aa", "small", "large"], ["coding", "toolcall"])
    aa, small, large = r.candidates
    assert aa.verdict == "PASS", aa.reasons
    assert all(m.ci_low > -m.tolerance for m in aa.metrics if m.gated)
    m = _metric(r, "coding/pass@1", 1)  # 1 point down, tolerance 3
    assert m.verdict in ("PASS", "INCONCLUSIVE") and small.verdict != "FAIL", m.reason
    assert m.verdict == ("PASS" if m.ci_low > -m.tolerance else "INCONCLUSIVE")
    m = _metric(r, "coding/pass@1", 2)
    assert large.verdict == "FAIL" and m.verdict == "FAIL" and m.ci_high < -m.tolerance
    assert m.flips["regressed"] >= 30 and m.flips["improved"] == 0 and m.p_adjusted <= 0.05
    assert "Holm" in m.reason and m.p_adjusted == pytest.approx(min(1, 3 * m.p_value)) or m.p_adjusted >= m.p_value
    assert r.verdict == "FAIL" and exit_code(r) == 1
    assert m.noise_band > 0 and m.details["noise_sd"] == m.noise_band  # the run-to-run SD is reported


@pytest.mark.slow
def test_default_suites_are_the_configured_ones_the_baseline_ran(wd):
    r = run_gate(wd, "base", ["aa"], config=QVerifyConfig())
    assert r.config["suites"] == ["coding", "toolcall"] and r.verdict == "PASS"
    r = run_gate(wd, "base", ["otheritems"], config=QVerifyConfig())  # it lacks toolcall: refused
    assert any("suite toolcall: no results" in p for p in r.candidates[0].integrity)


def test_identical_replicates_use_the_exact_bound(wd):
    """Zero variance: no item changed is evidence worth about 3/n, never a [0, 0] interval."""
    r = _gate(wd, "det", ["det", "det_small", "det_large"], ["coding"])
    same, small, large = (_metric(r, "coding/pass@1", i) for i in (0, 1, 2))
    assert same.delta == 0 and same.details["exact_bound"] and "exact betting bound" in same.method
    from qverify.gate.betting import lower_bound
    assert same.ci_low == pytest.approx(lower_bound(np.zeros(N), 0.05), rel=1e-6) and -4 / N < same.ci_low < -3 / N
    assert same.verdict == "PASS" and small.verdict != "FAIL" and small.ci_low < same.ci_low
    assert large.verdict == "FAIL" and large.flips["regressed"] == 36 and not large.details["exact_bound"]


def test_refuses_an_incomplete_run_and_says_why(wd):
    r = _gate(wd, "base", ["errs"], ["coding", "toolcall"])
    c = r.candidates[0]
    assert c.verdict == "INCONCLUSIVE" and exit_code(r) == 3
    assert any("errs, suite toolcall" in p and "infrastructure errors" in p and "budget" in p for p in c.integrity)
    assert [m.metric for m in c.metrics] == ["coding/pass@1"]  # the comparable suite is still measured
    assert any(x.startswith("toolcall: refused (") for x in c.reasons)


def test_refuses_mismatched_item_sets_and_build_ids(wd):
    r = _gate(wd, "base", ["otheritems", "renamed"], ["coding"])
    other, renamed = r.candidates
    assert any("item sets differ" in p for p in other.integrity) and not other.metrics
    assert any("build.json says build_id somethingelse" in p for p in renamed.integrity) and not renamed.metrics
    assert exit_code(r) == 3 and r.verdict == "INCONCLUSIVE"
    r = _gate(wd, "base", ["nosuchbuild"], ["coding"])
    assert any("no results" in p for p in r.candidates[0].integrity)


def test_too_few_items_is_inconclusive_with_advice(wd):
    m = _metric(_gate(wd, "tiny", ["tiny2"], ["coding"]), "coding/pass@1")
    assert m.verdict == "INCONCLUSIVE" and "only 8 paired items" in m.reason
    r = _gate(wd, "few", ["few2"], ["longctx"])
    m = _metric(r, "longctx/accuracy")
    assert m.verdict == "INCONCLUSIVE" and m.mde > m.tolerance
    assert m.details["needed_items"] > 40 and f"{m.details['needed_items']} items" in m.advice
    assert exit_code(r) == 2


def test_trigger_f1_jackknifed_against_the_baselines_runs(wd):
    r = _gate(wd, "vbase", ["vaa", "vnocall"], ["verifier"])
    ok, bad = _metric(r, "verifier/trigger_f1", 0), _metric(r, "verifier/trigger_f1", 1)
    assert ok.verdict == "PASS", ok.reason
    assert ok.details["k2vv_floor"] == pytest.approx(min(ok.baseline_spread) - 0.03)
    assert len(ok.candidate_spread) == 6  # (baseline k, candidate j != k): no same-seed pair
    assert bad.verdict == "FAIL" and r.candidates[1].verdict == "FAIL"
    hyg = _metric(r, "verifier/hygiene/empty", 0)
    assert hyg.direction == "lower" and hyg.gated


def test_no_tool_calls_on_either_side_is_a_refusal_not_a_pass(wd):
    r = _gate(wd, "vnone", ["vnone2"], ["verifier"])
    f1, schema = _metric(r, "verifier/trigger_f1"), _metric(r, "verifier/schema_accuracy")
    assert f1.verdict == "INCONCLUSIVE" and "no tool calls on either side" in f1.reason
    assert schema.verdict == "INCONCLUSIVE" and "undefined" in schema.reason
    assert r.candidates[0].verdict == "INCONCLUSIVE"


def test_answers_cut_at_max_tokens_cannot_pass_but_shown_damage_fails(wd):
    r = _gate(wd, "base", ["cut", "cutbad"], ["coding"], thresholds={"coding/pass@1": MetricRule(tolerance=0.06)})
    cut, bad = _metric(r, "coding/pass@1", 0), _metric(r, "coding/pass@1", 1)
    assert cut.verdict == "INCONCLUSIVE" and "finish=length" in cut.reason and cut.ci_low > -cut.tolerance
    assert bad.verdict == "FAIL"


def test_kld_is_a_one_sided_test_of_the_excess_distance(wd):
    r = _gate(wd, "kbase", ["knear", "kfar"], ["kld"])
    near, far = _metric(r, "kld/kld", 0), _metric(r, "kld/kld", 1)
    assert near.baseline_mean == 0.0 and near.verdict == "PASS" and 0 < near.delta < near.tolerance
    assert near.ci_high < near.tolerance
    assert far.verdict == "FAIL" and far.ci_low > far.tolerance
    assert not _metric(r, "kld/same_top", 1).gated
    r = _gate(wd, "knoisy", ["knoisy_near", "kfar"], ["kld"])
    assert _metric(r, "kld/kld", 0).verdict == "PASS" and _metric(r, "kld/kld", 1).verdict == "FAIL"


def test_gate_json_is_written_atomically_with_an_idempotent_id(wd):
    one = _gate(wd, "base", ["aa"], ["coding"])
    two = _gate(wd, "base", ["aa"], ["coding"])
    path = Workdir.at(wd).gate_dir(one.gate_id) / "gate.json"
    assert one.gate_id == two.gate_id and path.exists() and not path.with_name("gate.json.tmp").exists()
    back = GateReport.model_validate_json(path.read_text())
    assert back.candidates[0].metrics[0].delta == one.candidates[0].metrics[0].delta
    other = _gate(wd, "base", ["aa"], ["coding"], thresholds={"coding/pass@1": MetricRule(tolerance=0.05)})
    assert other.gate_id != one.gate_id


def test_thresholds_and_noise_margin_from_config(wd):
    r = _gate(wd, "base", ["large"], ["coding", "toolcall"], thresholds={"coding/*": MetricRule(gate=False)})
    assert not _metric(r, "coding/pass@1").gated and r.candidates[0].verdict != "FAIL"
    r = _gate(wd, "base", ["large"], ["coding"], thresholds={"coding/pass@1": MetricRule(tolerance=0.5)})
    assert _metric(r, "coding/pass@1").verdict == "PASS"  # a huge tolerance: shown within it
    m = _metric(_gate(wd, "base", ["small"], ["coding"], noise_k=100.0), "coding/pass@1")
    assert m.tolerance == pytest.approx(100 * m.details["noise_sd"]) and m.details["tolerance_configured"] == 0.03
    with pytest.raises(BadInput, match="did you mean 'coding/pass@1'"):
        _gate(wd, "base", ["aa"], ["coding"], thresholds={"coding/pass@l": MetricRule()})


def _cli(wd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "COLUMNS": "200"}
    # --no-report: the MLflow upload after the gate is tested with the reports (tests/reports)
    return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd), "gate", "--no-report", "--fixed", *args],
                          check=False, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.slow
def test_cli_exit_codes_json_and_table(wd):
    p = _cli(wd, "--baseline", "base", "--candidate", "aa", "--suites", "coding,toolcall", "--json")
    assert p.returncode == 0, p.stderr
    report = GateReport.model_validate(json.loads(p.stdout))
    assert report.verdict == "PASS" and len(report.candidates[0].metrics) == 3
    p = _cli(wd, "--baseline", "base", "--candidate", "aa", "--candidate", "large", "--suites", "coding")
    assert p.returncode == 1, p.stderr
    assert "coding/pass@1" in p.stdout and "FAIL" in p.stdout and "run SD" in p.stdout  # piped: the compact summary
    p = _cli(wd, "--baseline", "base")
    assert p.returncode == 4 and "go together" in p.stderr


@pytest.mark.slow
def test_cli_takes_a_build_as_a_directory_or_a_recipe_name(wd, tmp_path):
    """One resolver (Workdir.resolve_build) for every command: the gate takes build directories (it used to refuse
    them: "its build.json says build_id ... the build dir was renamed or copied") and recipe names, and decides
    exactly as on the ids."""
    by_id = _cli(wd, "--baseline", "base", "--candidate", "large", "--suites", "coding", "--json")
    by_dir = _cli(wd, "--baseline", str(wd / "builds" / "base"), "--candidate", str(wd / "builds" / "large"),
                  "--suites", "coding", "--json")
    assert by_id.returncode == by_dir.returncode == 1, by_dir.stderr
    a, b = GateReport.model_validate(json.loads(by_id.stdout)), GateReport.model_validate(json.loads(by_dir.stdout))
    assert (b.baseline, [c.build_id for c in b.candidates]) == ("base", ["large"])
    assert [m.model_dump() for m in a.candidates[0].metrics] == [m.model_dump() for m in b.candidates[0].metrics]
    from qverify.workdir import Workdir

    w = Workdir.at(wd)
    assert w.resolve_build_id("small") == w.resolve_build_id(wd / "builds" / "small") == "small"
    synth.write_build(tmp_path / "builds", "0123abcd", recipe="fp8kv")  # a recipe name that is no id prefix
    assert Workdir.at(tmp_path).resolve_build("fp8kv")[1].build_id == "0123abcd"



@pytest.mark.parametrize("base, cands, suites", [
    ("base", ["aa", "small", "large"], ["coding", "toolcall"]),
    ("vbase", ["vaa", "vnocall"], ["verifier"]),
    ("kbase", ["knear", "kfar"], ["kld"]),
])
def test_the_fixed_gate_is_the_flows_one_look_plan(wd, base, cands, suites):
    """`qverify gate --fixed` runs the one flow (qverify.rounds.gate_builds) as a plan of one look at all of alpha
    (Holm over the build's gated metrics, the build's verdict by rule.build_verdict): every metric's verdict and
    every reason is run_gate's at full alpha, with no look (issue #30: one way a verdict is reached)."""
    from qverify.rounds import gate_builds

    cfg = QVerifyConfig()
    fixed = run_gate(wd, base, cands, suites, cfg, write=False)
    one, looks, plan = gate_builds(Workdir.at(wd), cfg, base, cands, suites, None, show_progress=False)
    assert plan.looks == len(looks) == 1 and plan.is_fixed and one.config["look"]["pass_level"] == pytest.approx(0.05)

    def verdicts(r: GateReport):
        return [(c.build_id, c.verdict, sorted(c.reasons), c.integrity,
                 sorted((m.metric, m.verdict, m.reason) for m in c.metrics)) for c in r.candidates]

    assert verdicts(one) == verdicts(fixed)
    assert (wd / "gates" / one.gate_id / "gate.json").exists()
    assert {c.verdict for c in fixed.candidates} >= {"PASS", "FAIL"} or base != "base"  # both outcomes exercised


def test_several_candidates_are_a_family_and_family_wise_splits_alpha(wd):
    """Issue 29: m candidates against one baseline, picking whichever PASSes, risk about m alpha. The report names
    the family; family_wise (--family-wise) tests each candidate at alpha/m (Bonferroni): wider bounds."""
    from qverify.gate.render import compact_lines

    cands = ["aa", "small", "large"]
    each, fw = _gate(wd, "base", cands, ["coding"]), _gate(wd, "base", cands, ["coding"], family_wise=True)
    assert each.config["candidate_family"]["alpha_per_candidate"] == 0.05
    assert fw.config["candidate_family"]["alpha_per_candidate"] == pytest.approx(0.05 / 3)
    a, b = _metric(each, "coding/pass@1"), _metric(fw, "coding/pass@1")
    assert "one-sided 95% bounds" in a.reason and "one-sided 98.33% bounds" in b.reason and b.ci_low < a.ci_low
    assert fw.gate_id != each.gate_id
    text = " ".join(compact_lines(each))
    assert "family: 3 candidates gated against one baseline" in text and "about 3·alpha = 0.15" in text
    assert "--family-wise" in text
    assert "chance <= 0.05" in " ".join(compact_lines(fw))
    one = _gate(wd, "base", ["aa"], ["coding"], family_wise=True)  # a family of one: alpha unchanged, no note
    assert "candidate_family" not in one.config and "one-sided 95% bounds" in _metric(one, "coding/pass@1").reason
