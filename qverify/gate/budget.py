"""`qverify gate --budget 10m` (or a request count): the gate in rounds, a look after each.

Round j evaluates the first n_j = j * n_1 held-out items of every suite some metric of some
candidate has not decided yet (the generators extend, never reshuffle: round j's items are
round j-1's plus new ones; a finite source, real or coding's synthetic one, stops growing, the
report says it is exhausted, and its later rounds add `replicates` more replicates of the same items
instead while its metrics are undecided). After the round the gate looks at those
suites with its rule at the look's group-sequential levels (qverify.gate.boundaries): each
metric's PASS test and FAIL test has a boundary from an alpha-spending function over the
planned information fractions t_j = j / J, solved with the looks' joint law, so the chance of
a false PASS of a metric, or of any false FAIL of a build, over all looks stays <= alpha. A
decided metric keeps its verdict; a suite gets no more requests once its gated metrics are all
decided for every candidate that has not FAILed (one FAIL decides a build).

J, the planned looks, is fixed before the first round (a request budget buys J rounds;
a time budget plans `looks` (qverify.toml, default
MAX_LOOKS) and stops early when the next round would not fit, leaving
its alpha unspent). A finite source that runs out at look j is looked at with fewer items
than planned, and its rounds of more replicates add less information than a round of new items: its look
statistics are then more correlated than planned, which by Slepian's inequality only lowers the chance of
crossing (conservative). The plan and every look are kept
in gates/seq-<id>/sequence.json, so rerunning the same command resumes the sequence where it
stopped.

A sequence is keyed by what its data are (baseline, candidates, suites, first-look items, seed salt),
not by its plan: a second plan (another budget, alpha, replicates) on the same looks would spend alpha
afresh on data already looked at (optional stopping), so it is refused (issue 29).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from qverify.config import parse_budget
from qverify.errors import BadInput
from qverify.gate.boundaries import SPEND_GAMMA, LookLevels, nominal_levels
from qverify.gate.rule import ORDER, build_verdict, refusals
from qverify.models import CandidateReport, GateReport, MetricResult, content_hash
from qverify.workdir import sequence_path

MAX_LOOKS = 8
# (build ids, {suite: items}[, {suite: replicates}]) -> per build, items its runs now have; the third argument only
# where a suite's finite source ran out and its rounds add replicates (absent: the plan's replicates everywhere)
EvalFn = Callable[..., list[dict[str, int]]]


@dataclass
class Plan:
    suites: list[str]
    first: dict[str, int]  # items per suite at look 1 (and added per round)
    looks: int
    replicates: int
    alpha: float
    budget_requests: int | None = None
    budget_seconds: float | None = None
    gamma: float = SPEND_GAMMA
    extra_builds: dict[str, int] = field(default_factory=dict)  # suite -> builds evaluated besides baseline and
    # candidates (greedy: the candidates' twins, greedy/match's references), counted in the requests
    seed_salt: int = 0  # the runs' replicate-seed salt: another salt is new samples, so a new sequence

    def requests_for(self, new_items: dict[str, int], n_builds: int) -> int:
        return sum(n * self.replicates * (n_builds + self.extra_builds.get(s, 0)) for s, n in new_items.items())

    def round_requests(self, had: dict[str, int], items: dict[str, int], reps_had: dict[str, int],
                       reps: dict[str, int], n_builds: int) -> int:
        """A round's requests: its new items at the suite's replicates, plus the replicates it added to the items
        the runs already had (a suite whose finite source ran out)."""
        total = 0
        for s, n in items.items():
            old = min(had.get(s, 0), n)
            per_build = (n - old) * reps.get(s, self.replicates) + old * (reps.get(s, self.replicates)
                                                                          - reps_had.get(s, self.replicates))
            total += per_build * (n_builds + self.extra_builds.get(s, 0))
        return total

    def items_at(self, suite: str, look: int) -> int:
        return self.first[suite] * look

    def fractions(self) -> tuple[float, ...]:
        return tuple(float(j) for j in range(1, self.looks + 1))  # every suite grows by its n_1 per round

    def levels(self) -> list[float]:
        """Each look's nominal level of a metric's PASS test (and of a FAIL test in a family of one)."""
        return list(nominal_levels(self.fractions(), self.alpha, self.gamma))

    def look_levels(self, look: int, family: dict[str, int]) -> LookLevels:
        return LookLevels(self.fractions(), look, self.alpha, self.gamma, family)

    @classmethod
    def fixed(cls, suites: list[str], replicates: int, alpha: float) -> Plan:
        """The fixed gate: one look, all of alpha, at the runs as they are (no items added, nothing to resume)."""
        return cls(suites, {s: 0 for s in suites}, 1, replicates, alpha)

    @property
    def is_fixed(self) -> bool:
        return self.budget_requests is None and self.budget_seconds is None


def make_plan(suites: list[str], first: dict[str, int], replicates: int, n_builds: int, alpha: float,
              budget: str, time_looks: int = MAX_LOOKS, extra_builds: dict[str, int] | None = None,
              seed_salt: int = 0) -> Plan:
    """A request budget buys J = budget // (requests of a full round) looks; a time budget plans
    `time_looks` (qverify.toml `looks`) and stops when the next round would not fit."""
    requests, seconds = parse_budget(budget)
    plan = Plan(suites, first, time_looks, replicates, alpha, requests, seconds, extra_builds=dict(extra_builds or {}),
                seed_salt=seed_salt)
    if requests is not None:
        plan.looks = max(1, min(MAX_LOOKS * 4, requests // plan.requests_for(first, n_builds)))
    return plan


@dataclass
class Look:
    look: int
    level: float
    items: dict[str, int]
    requests: int  # cumulative, all builds
    seconds: float  # cumulative wall time of the rounds
    fail_level: float | None = None  # the first FAIL step's nominal level (family of every gated metric)
    metrics: dict[str, dict[str, dict]] = field(default_factory=dict)  # candidate -> metric -> summary
    exhausted: list[str] = field(default_factory=list)  # suites whose finite source had no more items
    replicates: dict[str, int] = field(default_factory=dict)  # suite -> replicates per item at this look, where a
    # finite source ran out and rounds add replicates of the same items instead (absent: the plan's)
    refused: dict[str, dict[str, list[str]]] = field(default_factory=dict)  # candidate -> suite -> why the gate
    # refused that suite's runs at this look (no metric rows: errors over budget, runs not comparable)


@dataclass
class _State:
    """What every look so far says, per candidate: each gated metric's latest result (frozen or not) and the
    suites whose latest look refused them. The final verdict is built from this, never from the last look
    alone: a suite that was not looked at again keeps its last word (issue 29's critical defect)."""
    latest: dict[str, dict[str, MetricResult]]
    frozen: dict[str, dict[str, MetricResult]]
    refused: dict[str, dict[str, list[str]]]

    @classmethod
    def empty(cls, candidates: list[str]) -> _State:
        return cls({c: {} for c in candidates}, {c: {} for c in candidates}, {c: {} for c in candidates})

    def record(self, lk: Look) -> None:
        for c, ms in lk.metrics.items():
            for name, m in ms.items():
                res = MetricResult.model_validate(m["result"])
                self.latest[c][name] = res
                if m["verdict"] != "INCONCLUSIVE":
                    self.frozen[c].setdefault(name, res)
        for c, suites in lk.refused.items():
            self.refused[c].update(suites)
        for c in self.refused:  # a suite with metric rows at this look is no longer refused
            for s in {name.split("/", 1)[0] for name in lk.metrics.get(c, {})}:
                self.refused[c].pop(s, None)

    def failed(self, c: str) -> bool:
        return any(m.verdict == "FAIL" for m in self.frozen[c].values())

    def undecided(self, suite: str) -> bool:
        """Some candidate that has not FAILed has a gated metric of the suite not frozen, or the suite refused
        (a FAILed build is decided: more items could only refine its other metrics, never its verdict)."""
        for c in self.latest:
            if self.failed(c):
                continue
            if suite in self.refused[c]:
                return True
            if any(name.startswith(f"{suite}/") and name not in self.frozen[c] for name in self.latest[c]):
                return True
        return False


def run_sequence(root: Path, baseline: str, candidates: list[str], plan: Plan, evaluate: EvalFn,
                 gate: Callable[[list[str], LookLevels], GateReport], clock: Callable[[], float] = time.monotonic
                 ) -> tuple[GateReport, list[Look]]:
    """Rounds until every gated metric of every candidate is decided or the plan/budget ends.

    evaluate(builds, {suite: n}) brings each build's runs to their first n items (the builds may run at once);
    gate(suites, look) gates all candidates on those suites at that look's levels (LookLevels).
    """
    seq_id = sequence_id(baseline, candidates, plan)
    state_path = sequence_path(root, seq_id)
    looks = [] if plan.is_fixed else _load(state_path, plan)
    state, exhausted, have, reps = _resume(looks, candidates, plan)
    levels = plan.levels()
    # the FAIL family of each candidate: its gated metrics at look 1, when every suite is open, and the declared
    # gated metrics of each suite refused then (a suite gated later is tested inside the family, not outside it)
    family = _family(looks[0]) if looks else {}
    report = None
    spent_s = looks[-1].seconds if looks else 0.0
    for j in range(len(looks) + 1, plan.looks + 1):
        open_suites = [s for s in plan.suites if not looks or state.undecided(s)]
        if looks and not open_suites:
            break
        # a finite source that ran out goes on with more replicates of the same items (issue 35.3): in the paired
        # design they shrink each item's within-item variance, so the look statistic still gains information (less
        # than planned, which only makes the looks more correlated than planned: conservative, see the docstring)
        want = {s: have[s] if s in exhausted else plan.items_at(s, j) for s in open_suites}
        now = {s: reps[s] + (plan.replicates if s in exhausted else 0) for s in open_suites}
        cost = plan.round_requests(have, want, reps, now, 1 + len(candidates))
        if plan.budget_seconds is not None and looks and spent_s + _next_round_s(looks, cost) > plan.budget_seconds:
            break
        t0 = clock()
        more = {s: r for s, r in now.items() if r != plan.replicates}
        got = evaluate([baseline, *candidates], want, more) if more else evaluate([baseline, *candidates], want)
        items = {s: min(g[s] for g in got) for s in open_suites}
        exhausted |= {s for s in open_suites if items[s] < want[s]}  # a finite source: no more held-out items
        stale = {s: items[s] for s in open_suites if s in exhausted and items[s] <= have.get(s, 0) and now[s] == reps[s]}
        if stale:  # ran out with nothing new: this round adds replicates instead, so that its look sees new data
            now.update({s: reps[s] + plan.replicates for s in stale})
            more = {s: r for s, r in now.items() if r != plan.replicates}
            evaluate([baseline, *candidates], stale, {s: now[s] for s in stale})
        spent_s += clock() - t0
        # before look 1, every gated metric the suites declare (a family such as longctx/accuracy@* counts once): a suite
        # refused at look 1 is then inside the family from the start (its FAIL tests at any look are counted)
        at = plan.look_levels(j, family or {c: _declared(plan.suites) for c in candidates})
        report = gate(open_suites, at)
        prev = looks[-1].requests if looks else 0
        lk = Look(j, levels[j - 1], items, prev + plan.round_requests(have, items, reps, now, 1 + len(candidates)),
                  spent_s, fail_level=at.fail_level(max(family.values(), default=1)), replicates=more)
        first_look = not family
        have.update(items)
        reps.update(now)
        _record_look(lk, report, state, open_suites)
        lk.exhausted = sorted(exhausted)
        if first_look:
            family = _family(lk)
            lk.fail_level = at.fail_level(max(family.values(), default=1))
        looks.append(lk)
        state.record(lk)
        if not plan.is_fixed:
            _save(state_path, plan, looks)
        if plan.budget_requests is not None and lk.requests >= plan.budget_requests:
            break
    if report is None and looks:  # the sequence had ended: report it again from its last look (runs unchanged)
        report = gate(list(looks[-1].items), plan.look_levels(len(looks), family if len(looks) > 1 else
                                                             {c: _declared(plan.suites) for c in candidates}))
    return _final(report, state, looks, plan, seq_id), looks


def _resume(looks: list[Look], candidates: list[str], plan: Plan
            ) -> tuple[_State, set[str], dict[str, int], dict[str, int]]:
    """A sequence's state after its stored looks: the metrics decided, the exhausted sources, each suite's items
    at its latest look and its replicates per item (grown past an exhausted source)."""
    state = _State.empty(candidates)
    have: dict[str, int] = {}
    reps = {s: plan.replicates for s in plan.suites}
    for lk in looks:
        state.record(lk)
        have.update(lk.items)
        reps.update(lk.replicates)
    return state, set(looks[-1].exhausted) if looks else set(), have, reps


def _record_look(lk: Look, report: GateReport, state: _State, open_suites: list[str]) -> None:
    """What a look decided, per candidate: each gated metric not frozen yet, and the suites the gate refused."""
    for c in report.candidates:
        lk.metrics[c.build_id] = {}
        for m in c.metrics:
            if m.metric in state.frozen[c.build_id] or not m.gated:  # informational metrics decide nothing
                continue
            lk.metrics[c.build_id][m.metric] = {"verdict": m.verdict, "delta": m.delta, "lo": m.ci_low,
                                                "hi": m.ci_high, "n": m.n_items, "result": m.model_dump(mode="json")}
        rows = {m.metric.split("/", 1)[0] for m in c.metrics}  # a suite with rows was gated (as run_gate says)
        lk.refused[c.build_id] = {s: _problems_of(s, c.integrity) for s in open_suites if s not in rows}


def _declared(suites: list[str]) -> int:
    from qverify.gate.metrics import specs_for_suite

    return sum(s.gated for suite in suites for s in specs_for_suite(suite))


def _family(first: Look) -> dict[str, int]:
    """Each candidate's FAIL family: its gated metrics at look 1 plus the declared gated metrics of every suite
    refused at look 1 (issue 35.5: such a suite, gated at a later look, was tested outside the family)."""
    return {c: len(first.metrics.get(c, {})) + sum(_declared([suite]) for suite in first.refused.get(c, {}))
            for c in first.metrics.keys() | first.refused.keys()}


def sequence_id(baseline: str, candidates: list[str], plan: Plan) -> str:
    """What the looks' data are, never how they are spent (budget, looks, alpha): a different plan on the same
    data finds the same sequence and is refused (_load) instead of starting with fresh alpha."""
    key = {"baseline": baseline, "candidates": candidates, "suites": plan.suites, "first": plan.first,
           "seed_salt": plan.seed_salt}
    return "seq-" + content_hash(key, 12)


def _problems_of(suite: str, integrity: list[str]) -> list[str]:
    """The refusals that name the suite; a build-level refusal (naming no suite) refuses every suite."""
    named = [p for p in integrity if f"suite {suite}" in p]
    return named or list(integrity) or [f"suite {suite}: no gated metric could be measured"]


def _next_round_s(looks: list[Look], requests: int) -> float:
    """The next round's time at the last round's seconds per request: later rounds evaluate fewer suites than the
    first, so the plain average of past rounds would stop a time budget a round early."""
    last, before = looks[-1], (looks[-2] if len(looks) > 1 else None)
    done = last.requests - (before.requests if before else 0)
    return (last.seconds - (before.seconds if before else 0.0)) * requests / max(done, 1)


def _final(last: GateReport | None, state: _State, looks: list[Look], plan: Plan, seq_id: str) -> GateReport:
    """Each candidate's verdict over every gated metric any look measured (frozen verdicts, else the latest
    result) and every suite whose latest look refused it: PASS only when all of them PASSed and none was
    refused; the reasons say how many of the declared gated metrics were decided."""
    if last is None:
        raise BadInput("the sequence has no look to report", fix="rerun with a larger --budget")
    cands = []
    for c in last.candidates:
        ms = {m.metric: m for m in c.metrics if not m.gated}  # informational rows: the last look's
        ms.update(state.latest[c.build_id])
        ms.update(state.frozen[c.build_id])
        metrics = sorted(ms.values(), key=lambda m: m.metric)
        refused = state.refused[c.build_id]
        verdict, reasons = build_verdict(metrics, refused)
        integrity = refusals(refused)
        cands.append(CandidateReport(build_id=c.build_id, recipe=c.recipe, verdict=verdict, reasons=reasons,
                                     metrics=metrics, perf=c.perf, integrity=integrity, seed_salts=c.seed_salts,
                                     compared_with=c.compared_with))
    verdict = max((c.verdict for c in cands), key=ORDER.__getitem__, default="INCONCLUSIVE")
    seq = {"id": seq_id, "plan": asdict(plan), "looks": [{k: v for k, v in asdict(lk).items() if k != "metrics"}
                                                         | {"metrics": _brief(lk)} for lk in looks]}
    config = {**last.config, "sequential": seq}
    gate_id = content_hash({"seq": seq_id, "looks": len(looks), "runs": last.gate_id}, 12)
    return GateReport(gate_id=gate_id, baseline=last.baseline, baseline_recipe=last.baseline_recipe, verdict=verdict,
                      candidates=cands, config=config)


def _brief(lk: Look) -> dict:
    return {c: {name: {k: v for k, v in m.items() if k != "result"} for name, m in ms.items()}
            for c, ms in lk.metrics.items()}


def _load(path: Path, plan: Plan) -> list[Look]:
    """The looks so far of the sequence at `path`, which must have been planned as `plan` (else BadInput)."""
    if not path.exists():
        return []
    state = json.loads(path.read_text())
    if isinstance(state, list):  # written before the plan was stored, under an id hashed from that plan: the same plan
        state = {"plan": _plain(plan), "looks": state}
    looks = [Look(**x) for x in state["looks"]]
    was, now = state["plan"], _plain(plan)
    if looks and was != now:
        diff = ", ".join(f"{k} {was.get(k)} -> {v}" for k, v in now.items() if was.get(k) != v)
        spent = (f"{was['budget_requests']} requests" if was.get("budget_requests") is not None
                 else f"{was.get('budget_seconds')} s")
        raise BadInput(f"{path} already holds {len(looks)} look(s) of this baseline, candidates and suites planned "
                       f"with budget {spent}, {was['looks']} looks, alpha {was['alpha']}; a different plan ({diff}) "
                       "on the same data would spend alpha afresh on looks already taken (optional stopping)",
                       fix=f"rerun with its plan (--budget {_budget_text(was)}) to resume or re-report it (new samples "
                           "of the same items, another --seed-salt or workdir, are the same experiment: "
                           "qverify.gate.ledger counts them against the same alpha)")
    return looks


def _plain(plan: Plan) -> dict:
    return json.loads(json.dumps(asdict(plan)))  # as stored: tuples -> lists, int keys -> str


def _budget_text(plan: dict) -> str:
    if plan.get("budget_requests") is not None:
        return str(plan["budget_requests"])
    return f"{plan.get('budget_seconds'):g}s"


def _save(path: Path, plan: Plan, looks: list[Look]) -> None:
    from qverify.evals.store import atomic_write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"plan": asdict(plan), "looks": [asdict(lk) for lk in looks]}))
