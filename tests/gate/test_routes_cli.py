"""The re-gating routes a user can take, through `qverify gate`'s own code path on disk (issue 35.2): the structure
that keeps benchmarks/gate_oc_routes.py's rates at or under alpha. Each test runs one route of tests/routes_sim.py
(a real workdir, runs in the RunStore's format, the real ledger, qverify.rounds.gate; generation alone simulated,
no model is run) and checks what the ledger made of it. Each fails when ledger.remaining is bypassed (every gate at
its full alpha, the rule before): `test_the_routes_see_a_bypassed_ledger` runs them so."""

from __future__ import annotations

import pytest

from qverify.gate import ledger
from qverify.gate.boundaries import SPEND_GAMMA, spending
from tests import routes_sim as rs

TOL = 0.06  # 15-item rounds (the benchmark's scale): the default plan's J = 10 looks
ALPHA = 0.05


@pytest.fixture(scope="module")
def cfg():
    return rs.config(tol=TOL, first=15)


def _plan_alpha(report) -> float:
    return report.config["sequential"]["plan"]["alpha"]


def _spent(t: rs.Trial) -> dict[str, float]:
    """What each instance has spent on the suite, by the ledger in the trial's runs."""
    out: dict[str, float] = {}
    for e in ledger.entries(t.wd.runs, rs.BASE, rs.CAND, rs.SUITE):
        out[e["instance"]] = max(out.get(e["instance"], 0.0), e["spent"])
    return out


def stopped_then_fixed(cfg, tmp_path) -> None:
    """(b) A sequence stopped by its time budget after look 3 of J spent f(3/J); `--fixed` on the runs grown to the
    plan's items gets only the rest, and the two together spend alpha."""
    with rs.trial(11, -TOL, cfg, tmp_path) as t:
        rs.run_route(t, "b")
        assert t.codes[0] == 2 and len(t.codes) == 2
        left = ALPHA - float(spending(3 / rs.rounds_of(cfg), ALPHA, SPEND_GAMMA))
        assert 0 < left < ALPHA
        assert _plan_alpha(t.reports[1]) == pytest.approx(left)
        assert sum(_spent(t).values()) == pytest.approx(ALPHA)


def request_budget_of_three_rounds_then_fixed(cfg, tmp_path) -> None:
    """(b) with a request budget that buys 3 rounds: that plan is 3 looks and spends all of alpha by its last, so
    `--fixed` on the grown runs is refused."""
    with rs.trial(17, -TOL, cfg, tmp_path) as t:
        t.gate(budget=str(3 * rs.first_items(cfg) * cfg.replicates * 2))
        assert t.codes == [2] and t.reports[0].config["sequential"]["plan"]["looks"] == 3
        t.evaluate(rs.rounds_of(cfg) * rs.first_items(cfg))
        assert t.gate(fixed=True) == 4 and "is spent" in str(t.reports[1])


def fixed_after_deleting_gates(cfg, tmp_path) -> None:
    """(d) A fixed gate spends all of alpha; deleting gates/ and growing the runs leaves the ledger: the next is
    refused (exit 4) and says why."""
    with rs.trial(12, -TOL, cfg, tmp_path) as t:
        rs.fixed_every_round(t, gates=3)
        assert t.codes[0] == 2
        assert t.codes[1:] == [4, 4] and all("is spent" in str(r) for r in t.reports[1:])


def copied_runs(cfg, tmp_path) -> None:
    """(e) The runs copied into a new workdir carry their ledger: the default gate there is refused because the
    alpha is spent (not merely because its runs are bigger than a new sequence's first look)."""
    with rs.trial(13, -TOL, cfg, tmp_path) as t:
        rs.run_route(t, "e")
        assert t.codes == [2, 4]
        assert "is spent" in str(t.reports[1])
        assert (t.wd.runs / rs.CAND / ledger.LEDGER).exists()


def new_salt_after_the_end(cfg, tmp_path) -> None:
    """(c) Another --seed-salt after a sequence that ran to its end is the same experiment: refused, alpha spent."""
    with rs.trial(14, -TOL, cfg, tmp_path) as t:
        rs.run_route(t, "c")
        assert t.codes == [2, 4] and "is spent" in str(t.reports[1])


def new_salt_after_a_stop(cfg, tmp_path) -> None:
    """(c2) Another salt after a sequence stopped at look 3: the runner refuses runs of the other salt (its fix:
    eval --fresh), and the new salt's sequence is planned at the alpha the stopped one left, not at alpha."""
    with rs.trial(15, -TOL, cfg, tmp_path) as t:
        rs.run_route(t, "c2")
        assert t.codes[:2] == [2, 4] and "seed salt" in str(t.reports[1])
        left = ALPHA - float(spending(3 / rs.rounds_of(cfg), ALPHA, SPEND_GAMMA))
        assert _plan_alpha(t.reports[2]) == pytest.approx(left)
        assert sum(_spent(t).values()) <= ALPHA + 1e-12


ROUTES = [stopped_then_fixed, request_budget_of_three_rounds_then_fixed, fixed_after_deleting_gates, copied_runs, new_salt_after_the_end, new_salt_after_a_stop]


@pytest.mark.parametrize("route", ROUTES, ids=[r.__name__ for r in ROUTES])
def test_route(route, cfg, tmp_path):
    route(cfg, tmp_path)


def test_the_routes_see_a_bypassed_ledger(cfg, tmp_path):
    """With ledger.remaining returning alpha (every gate at full alpha), each route's test above fails."""
    with rs.ledger_bypassed():
        for i, route in enumerate(ROUTES):
            with pytest.raises(AssertionError):
                (tmp_path / str(i)).mkdir()
                route(cfg, tmp_path / str(i))


def test_the_default_route_at_zero_can_pass(cfg, tmp_path):
    """The harness can PASS (the rates above are not zero for want of a PASS): an unchanged build's default gate."""
    with rs.trial(16, 0.0, cfg, tmp_path) as t:
        rs.run_route(t, "a")
        assert t.codes == [0]
        assert max(_spent(t).values()) <= ALPHA


def test_a_gate_refused_for_bigger_runs_does_not_advise_another_workdir(cfg, tmp_path):
    """A sequence stopped after look 3, gates/ deleted, the same gate again: a new sequence's first round would
    shrink the runs, and the runner refuses. Its fix advised "or use another --workdir", where no ledger is: a
    fresh alpha on the same hypothesis (the multiple testing no tool can see). Advised by the tool, it is a route
    that raises the false-PASS rate, so the gate's rounds advise --fresh only (the ledger stays with the runs)."""
    with rs.trial(18, -TOL, cfg, tmp_path) as t:
        first = rs.stopped_budget(t)
        assert t.gate(**first) == 2
        rs.shutil.rmtree(t.wd.gates)
        assert t.gate(**first) == 4
        refusal = t.reports[-1]
        assert "another item set" in str(refusal)
        assert "--fresh" in refusal.fix and "--workdir" not in refusal.fix
