"""The budgeted sequential gate's loop on synthetic runs written through the real RunStore.

The round's `evaluate` writes the first n items of pre-drawn outcomes (what a server would have
answered for those items); the gate is the real run_gate at the look's spending level.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from qverify.config import QVerifyConfig, parse_budget
from qverify.errors import BadInput
from qverify.gate import run_gate
from qverify.gate.budget import make_plan, run_sequence, sequence_id
from qverify.gate.gate import exit_code
from qverify.workdir import Workdir
from tests import synth

KMAX = 36  # replicate columns drawn per item: rounds past an exhausted source add replicates
NMAX, K = 2000, 3


def _outcomes(rng, n, loss=0.0, base=None):
    p = np.where(rng.random(n) < 0.75, 1.0, np.where(rng.random(n) < 0.5, 0.0, 0.5)) if base is None else base.copy()
    p[(p == 1.0) & (rng.random(n) < loss)] = 0.0
    return p


class Rounds:
    """evaluate(build, {suite: n}): runs now hold the first n items (a finite source may have fewer)."""

    def __init__(self, wd: Path, probs: dict[str, dict[str, np.ndarray]], available: dict[str, int] | None = None,
                 unseeded: tuple[str, ...] = (), errors: dict[tuple[str, str], float] | None = None):
        self.wd, self.calls = wd, []
        rng = np.random.default_rng(5)
        more = np.random.default_rng(6)  # the replicates past K (rounds past an exhausted source): drawn apart, so
        # that the first K are what they were before those rounds existed
        u = {s: np.hstack([rng.random((NMAX, K)), more.random((NMAX, KMAX - K))]) for s in next(iter(probs.values()))}
        # a suite in `unseeded` draws fresh uniforms per build (a server whose seeds do not reproduce)
        self.data = {b: {s: ((np.hstack([rng.random((NMAX, K)), more.random((NMAX, KMAX - K))]) if s in unseeded
                              else u[s]) < p[:, None]).astype(float) for s, p in ps.items()} for b, ps in probs.items()}
        self.available = available or {}
        # (build, suite) -> share of its requests that end in an infrastructure error
        self.errors = {key: np.hstack([rng.random((NMAX, K)) < rate, np.zeros((NMAX, KMAX - K), bool)])
                       for key, rate in (errors or {}).items()}
        for b in probs:
            synth.write_build(wd / "builds", b, b)

    def __call__(self, builds: list[str], want: dict[str, int], reps: dict[str, int] | None = None
                 ) -> list[dict[str, int]]:
        return [self.one(b, want, reps or {}) for b in builds]

    def one(self, build: str, want: dict[str, int], reps: dict[str, int]) -> dict[str, int]:
        self.calls.append((build, dict(want), dict(reps)))
        out = {}
        for s, n in want.items():
            n, k = min(n, self.available.get(s, NMAX)), reps.get(s, K)
            x = self.data[build][s][:n, :k]
            err = self.errors.get((build, s))
            res = synth.results(s, synth.item_ids(s, n), {_key(s): x}, errors=None if err is None else err[:n, :k])
            synth.write_run(self.wd / "runs", build, s, res)
            out[s] = n
        return out


def _key(suite: str) -> str:
    return {"coding": "pass@1", "longctx": "accuracy"}[suite]


def _gate(wd: Path, base: str, cand: str):
    return lambda suites, look: run_gate(wd, base, [cand], suites, QVerifyConfig(alpha=0.05), write=False, look=look)


def test_a_time_budget_plans_the_configured_looks_a_request_budget_buys_its_own():
    assert make_plan(["coding"], {"coding": 200}, 3, 2, 0.05, "10m").looks == 8
    four = make_plan(["coding"], {"coding": 200}, 3, 2, 0.05, "10m", time_looks=4)
    assert four.looks == 4 and four.levels()[0] > make_plan(["coding"], {"coding": 200}, 3, 2, 0.05, "10m").levels()[0]
    assert make_plan(["coding"], {"coding": 200}, 3, 2, 0.05, "3600", time_looks=4).looks == 3


def test_parse_budget():
    assert parse_budget("4000") == (4000, None) and parse_budget("10m") == (None, 600.0)
    assert parse_budget("90s") == (None, 90.0) and parse_budget("1h") == (None, 3600.0)
    for bad in ("ten minutes", "0", "0.5", "0m"):  # nothing to spend is bad input, for the flag and the config
        with pytest.raises(BadInput):
            parse_budget(bad)


def test_a_clear_regression_fails_at_the_first_look_and_stops(tmp_path):
    rng = np.random.default_rng(1)
    p = _outcomes(rng, NMAX)
    ev = Rounds(tmp_path, {"base": {"coding": p}, "bad": {"coding": _outcomes(rng, NMAX, 0.3, p)}})
    plan = make_plan(["coding"], {"coding": 200}, K, 2, 0.05, "12000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["bad"], plan, ev, _gate(tmp_path, "base", "bad"))
    assert plan.looks == 10 and len(looks) == 1 and rep.verdict == "FAIL"
    assert looks[0].requests == 2 * K * 200 and looks[0].level == pytest.approx(plan.levels()[0])


def test_a_failed_build_gets_no_more_rounds(tmp_path):
    """coding FAILs at look 1; longctx (noisy, identical builds) is undecided, but the build's verdict is FAIL
    whatever it would show, so no second round is run."""
    rng = np.random.default_rng(6)
    pc, pl = _outcomes(rng, NMAX), np.full(NMAX, 0.5)
    probs = {"base": {"coding": pc, "longctx": pl}, "bad": {"coding": _outcomes(rng, NMAX, 0.3, pc), "longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",))
    plan = make_plan(["coding", "longctx"], {"coding": 200, "longctx": 200}, K, 2, 0.05, "24000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["bad"], plan, ev, _gate(tmp_path, "base", "bad"))
    verdicts = {m.metric: m.verdict for m in rep.candidates[0].metrics if m.gated}
    assert rep.verdict == "FAIL" and verdicts["coding/pass@1"] == "FAIL" and len(looks) == 1
    assert "INCONCLUSIVE" in verdicts.values()  # longctx was left undecided, not run on


@pytest.mark.slow
def test_undecided_suites_get_the_next_round_decided_ones_stop(tmp_path):
    """coding (stable, identical builds) PASSes early; longctx (noisy) needs more items; each look is kept."""
    rng = np.random.default_rng(2)
    pc = _outcomes(rng, NMAX)
    pl = np.full(NMAX, 0.5)
    probs = {"base": {"coding": pc, "longctx": pl}, "same": {"coding": pc, "longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",))
    plan = make_plan(["coding", "longctx"], {"coding": 300, "longctx": 300}, K, 2, 0.05, "30000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, ev, _gate(tmp_path, "base", "same"))
    verdicts = {m.metric: m.verdict for m in rep.candidates[0].metrics}
    assert verdicts["coding/pass@1"] == "PASS"
    coding_looks = [lk.look for lk in looks if "coding" in lk.items]
    assert len(coding_looks) < len(looks)  # coding stopped getting requests once decided
    assert all(len(lk.metrics["same"]) >= 1 for lk in looks)  # each look records the undecided metrics' bounds
    seq = rep.config["sequential"]
    assert len(seq["looks"]) == len(looks) and seq["plan"]["looks"] == plan.looks
    # later looks test FAIL within the family of every gated metric seen at look 1, decided ones included
    n_gated = len(looks[0].metrics["same"])
    assert rep.config["look"]["family"] == {"same": n_gated} and rep.config["look"]["look"] == len(looks) > 1
    assert looks[-1].fail_level == pytest.approx(plan.look_levels(len(looks), {}).fail_level(n_gated))


def test_resume_continues_the_sequence(tmp_path):
    rng = np.random.default_rng(3)
    pl = np.full(NMAX, 0.5)
    probs = {"base": {"longctx": pl}, "same": {"longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",))
    plan = make_plan(["longctx"], {"longctx": 100}, K, 2, 0.05, "6000")
    stop = {"at": 3}

    def flaky(builds, want):
        if want["longctx"] >= stop["at"] * 100:
            raise RuntimeError("server died")
        return ev(builds, want)

    root = Workdir.at(tmp_path).gates
    with pytest.raises(RuntimeError):
        run_sequence(root, "base", ["same"], plan, flaky, _gate(tmp_path, "base", "same"))
    stop["at"] = 10 ** 6
    n_calls = len(ev.calls)
    rep, looks = run_sequence(root, "base", ["same"], plan, flaky, _gate(tmp_path, "base", "same"))
    assert looks[0].look == 1 and looks[1].look == 2  # the first two looks were kept, not redone
    assert ev.calls[n_calls][1]["longctx"] == 300  # the resumed run starts at look 3
    assert [lk.level for lk in looks] == pytest.approx(plan.levels()[: len(looks)])


def test_a_finite_source_is_exhausted_and_said_so(tmp_path):
    rng = np.random.default_rng(4)
    pl = np.full(NMAX, 0.5)
    ev = Rounds(tmp_path, {"base": {"longctx": pl}, "same": {"longctx": pl}}, available={"longctx": 150},
                unseeded=("longctx",))
    plan = make_plan(["longctx"], {"longctx": 100}, K, 2, 0.05, "6000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, ev, _gate(tmp_path, "base", "same"))
    assert looks[-1].exhausted == ["longctx"] and looks[-1].items["longctx"] == 150 and len(looks) >= 3
    assert looks[1].items["longctx"] == 150 and not looks[1].replicates  # 100, then 150 of 200 wanted
    # then rounds of 3 more replicates of the same 150 items (issue 35.3), counted as requests like any round
    assert [lk.replicates.get("longctx") for lk in looks[2:]] == [6, 9, 12, 15, 18, 21][: len(looks) - 2]
    assert [lk.requests for lk in looks] == [600, 900, 1800, 2700, 3600, 4500, 5400, 6300][: len(looks)]


@pytest.mark.slow
def test_a_time_budget_runs_the_rounds_that_fit_at_the_last_rounds_pace(tmp_path):
    """Each new item costs 0.05 s per build on a fake clock. Round 1 (coding + longctx, 300 each, 2 builds)
    costs 60 s and decides coding; a round of longctx alone then costs 30 s, so rounds 2 and 3 fit a 125 s
    budget (60 + 30 + 30) and round 4 does not. The old estimate (the mean of past rounds) stopped after 2."""
    rng = np.random.default_rng(2)
    pc = _outcomes(rng, NMAX)
    pl = np.full(NMAX, 0.5)  # unseeded coin flips: 900 items cannot show +-3 points at the looks' levels
    probs = {"base": {"coding": pc, "longctx": pl}, "same": {"coding": pc, "longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",))
    now, have = [0.0], {}

    def evaluate(builds, want):
        gots = ev(builds, want)
        for build, got in zip(builds, gots):
            now[0] += 0.05 * sum(n - have.get((build, s), 0) for s, n in got.items())
            have.update({(build, s): n for s, n in got.items()})
        return gots

    plan = make_plan(["coding", "longctx"], {"coding": 300, "longctx": 300}, K, 2, 0.05, "125s", time_looks=8)
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, evaluate,
                              _gate(tmp_path, "base", "same"), clock=lambda: now[0])
    assert [lk.items for lk in looks] == [{"coding": 300, "longctx": 300}, {"longctx": 600}, {"longctx": 900}]
    assert [round(lk.seconds) for lk in looks] == [60, 90, 120]


def _noisy_longctx_keeps_the_sequence_going():
    return np.full(NMAX, 0.5)  # unseeded coin flips on identical builds: undecided for several looks


@pytest.mark.slow
def test_a_suite_refused_at_a_look_keeps_the_build_from_passing(tmp_path):
    """Issue 29: the candidate gets every coding item wrong, and 22% of its coding requests error, so the gate
    refuses coding (over the 2% error budget) and it has no metric rows; longctx needs more looks. The old
    sequence counted coding as decided, never looked at it again, and ended PASS."""
    rng = np.random.default_rng(11)
    pc, pl = _outcomes(rng, NMAX), _noisy_longctx_keeps_the_sequence_going()
    probs = {"base": {"coding": pc, "longctx": pl}, "bad": {"coding": np.zeros(NMAX), "longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",), errors={("bad", "coding"): 0.22})
    plan = make_plan(["coding", "longctx"], {"coding": 200, "longctx": 200}, K, 2, 0.05, "12000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["bad"], plan, ev, _gate(tmp_path, "base", "bad"))
    c = rep.candidates[0]
    assert len(looks) > 1 and rep.verdict == "INCONCLUSIVE" and c.verdict == "INCONCLUSIVE"
    assert any("coding" in p and "infrastructure errors" in p for p in c.integrity)
    assert any(r.startswith("coding: refused") for r in c.reasons)
    assert all("coding" in lk.items for lk in looks)  # a refused suite stays open: it is looked at every round
    assert exit_code(rep) != 0


def test_an_exhausted_suite_keeps_its_undecided_metric_in_the_verdict(tmp_path):
    """Issue 29: a 150-item coding source runs out while coding/pass@1 is INCONCLUSIVE (the candidate loses
    about 6.7 points); longctx goes on. The old final report was the last look plus frozen verdicts, so
    coding/pass@1 vanished and the build PASSed."""
    rng = np.random.default_rng(12)
    pc, pl = np.full(NMAX, 0.6), _noisy_longctx_keeps_the_sequence_going()
    worse = pc.copy()
    worse[rng.random(NMAX) < 0.067 / 0.6] = 0.0
    probs = {"base": {"coding": pc, "longctx": pl}, "worse": {"coding": worse, "longctx": pl}}
    ev = Rounds(tmp_path, probs, available={"coding": 150}, unseeded=("coding", "longctx"))
    plan = make_plan(["coding", "longctx"], {"coding": 100, "longctx": 50}, K, 2, 0.05, "12000")
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["worse"], plan, ev,
                              _gate(tmp_path, "base", "worse"))
    c = rep.candidates[0]
    verdicts = {m.metric: m.verdict for m in c.metrics if m.gated}
    assert "coding" in looks[-1].exhausted and looks[1].items["coding"] == 150
    assert verdicts["coding/pass@1"] != "PASS" and c.verdict != "PASS"
    if c.verdict == "INCONCLUSIVE":
        assert any(r.startswith("coding/pass@1:") for r in c.reasons)
        n = len(verdicts)
        assert f"{sum(v != 'INCONCLUSIVE' for v in verdicts.values())} of {n} declared gated metrics decided" in c.reasons


def test_an_exhausted_undecided_suite_goes_on_with_more_replicates(tmp_path):
    """Issue 35.3: a 150-item source, identical builds on unseeded items right with probability 0.75 or 0.25: at 3
    replicates the bound is about -0.08 (undecided at tol 0.03); rounds of 3 more replicates of the same items
    shrink each item's within variance until it PASSes (at 15 replicates). The rule before stopped at the exhausted
    source, INCONCLUSIVE. The round that finds the source empty adds replicates at once (no look on unchanged runs)."""
    rng = np.random.default_rng(13)
    pc = np.where(rng.random(NMAX) < 0.5, 0.75, 0.25)
    ev = Rounds(tmp_path, {"base": {"coding": pc}, "same": {"coding": pc}}, available={"coding": 150},
                unseeded=("coding",))
    plan = make_plan(["coding"], {"coding": 150}, K, 2, 0.05, str(12 * 150 * K * 2))
    rep, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, ev, _gate(tmp_path, "base", "same"))
    assert rep.candidates[0].verdict == "PASS", rep.candidates[0].reasons
    assert looks[1].exhausted == ["coding"] and looks[1].replicates == {"coding": 2 * K}
    assert all(lk.items["coding"] == 150 for lk in looks) and looks[-1].replicates["coding"] > 2 * K
    assert looks[1].requests - looks[0].requests == 150 * K * 2  # 3 more replicates of 150 items on 2 builds


def test_a_pass_says_every_declared_metric_was_decided(tmp_path):
    rng = np.random.default_rng(2)
    pc = _outcomes(rng, NMAX)
    ev = Rounds(tmp_path, {"base": {"coding": pc}, "same": {"coding": pc}})
    plan = make_plan(["coding"], {"coding": 300}, K, 2, 0.05, "30000")
    rep, _ = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, ev, _gate(tmp_path, "base", "same"))
    assert rep.verdict == "PASS" and rep.candidates[0].reasons == [
        "all 1 of 1 declared gated metrics decided, within their tolerances"]


def test_another_plan_on_the_same_looks_is_refused_a_new_salt_is_a_new_sequence(tmp_path):
    """Issue 29: a larger budget used to hash to a new sequence and look again at the same items with fresh alpha.
    The sequence is keyed by its data (baseline, candidates, suites, first look, salt); another plan is exit 4."""
    pl = _noisy_longctx_keeps_the_sequence_going()
    ev = Rounds(tmp_path, {"base": {"longctx": pl}, "same": {"longctx": pl}}, unseeded=("longctx",))
    root, gate = Workdir.at(tmp_path).gates, _gate(tmp_path, "base", "same")
    plan = make_plan(["longctx"], {"longctx": 50}, K, 2, 0.05, "300")  # one round of 50 items x 3 x 2 builds
    first, looks = run_sequence(root, "base", ["same"], plan, ev, gate)
    assert plan.looks == len(looks) == 1 and len(ev.calls) == 2
    for other in (make_plan(["longctx"], {"longctx": 50}, K, 2, 0.05, "600"),
                  make_plan(["longctx"], {"longctx": 50}, K, 2, 0.10, "300")):
        with pytest.raises(BadInput) as e:
            run_sequence(root, "base", ["same"], other, ev, gate)
        assert "spend alpha afresh" in str(e.value) and "--budget 300" in e.value.fix and "--seed-salt" in e.value.fix
    assert len(ev.calls) == 2  # refused before any request
    again, _ = run_sequence(root, "base", ["same"], plan, ev, gate)  # the same plan re-reports the ended sequence
    assert len(ev.calls) == 2 and again.verdict == first.verdict and again.gate_id == first.gate_id
    salted = make_plan(["longctx"], {"longctx": 50}, K, 2, 0.05, "300", seed_salt=1)
    assert sequence_id("base", ["same"], salted) != sequence_id("base", ["same"], plan)
    assert sequence_id("base", ["same"], make_plan(["longctx"], {"longctx": 50}, K, 2, 0.05, "900")) == \
        sequence_id("base", ["same"], plan)


def test_a_suite_refused_at_look_1_is_inside_the_fail_family(tmp_path):
    """Issue 35.5: the FAIL family was the gated metrics with rows at look 1, so a suite refused then (coding: 22%
    errors in round 1) and gated later was tested outside it. Now its declared gated metrics count from look 1 on."""
    rng = np.random.default_rng(11)
    pc, pl = _outcomes(rng, NMAX), _noisy_longctx_keeps_the_sequence_going()
    probs = {"base": {"coding": pc, "longctx": pl}, "same": {"coding": pc, "longctx": pl}}
    ev = Rounds(tmp_path, probs, unseeded=("longctx",), errors={("same", "coding"): 0.22})
    plan = make_plan(["coding", "longctx"], {"coding": 100, "longctx": 100}, K, 2, 0.05, "2400")
    _, looks = run_sequence(Workdir.at(tmp_path).gates, "base", ["same"], plan, ev, _gate(tmp_path, "base", "same"))
    assert "coding" in looks[0].refused["same"] and "coding/pass@1" not in looks[0].metrics["same"]
    assert looks[0].fail_level == pytest.approx(plan.look_levels(1, {}).fail_level(2))  # longctx's 1 + coding's 1
