"""A user's routes to gate one candidate again, run through `qverify gate`'s own code path on disk (issue 35.2).

For benchmarks/gate_oc_routes.py (the rates) and tests/gate/test_routes_cli.py (the structure that makes them hold).
Each trial is a real Workdir in a temp folder (two build.json-only builds, tests/synth.write_build), real runs in
the RunStore's format, the real ledger, and qverify.rounds.gate (what `qverify gate` calls; the MLflow upload is
skipped). The ONLY simulated part is generation: qverify.rounds._evaluator is replaced by `evaluator` below, which
runs the real pipeline.make_plan (so the runner's own checks of what is stored refuse what they refuse: another
seed salt, another item set) and then appends, for every pending (item, replicate), a scored record drawn from an
item model instead of asking a model, and closes the run with the runner's own finalize. No model is run.

The item model: toolcall's fitted one (benchmarks/gate_oc_fitted.py), p_i ~ Beta(0.58, 0.29), 3 replicates, half
the replicate samples shared between the builds (coupling 0.5); the candidate at population Δ loses a random share
-Δ / E[p] of the items outright (concentrated damage). Draws are keyed by (trial, seed salt, item, replicate), so
rerunning a build's items gives the same answers, and another salt gives new samples of the same items. One gated
metric, toolcall/exact_call (toolcall/trigger ungated through qverify.toml's thresholds, as a user would).
"""

from __future__ import annotations

import copy
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from unittest import mock

import numpy as np

from qverify import rounds
from qverify.config import MetricRule, QVerifyConfig
from qverify.errors import BadInput
from qverify.evals.store import RunStore
from qverify.gate import exit_code
from qverify.models import ItemResult, Response, RunManifest, ServingProfile
from qverify.output import Output
from qverify.workdir import Workdir
from tests import synth

BETA = (0.58, 0.29)
SUITE, METRIC = "toolcall", "exact_call"
BASE, CAND = "base", "cand"
COUPLING = 0.5
SECONDS_PER_REQUEST = 0.01  # the simulated clock of a time budget: every request "takes" this long


def config(tol: float = 0.03, first: int | None = None, **kw) -> QVerifyConfig:
    """`first`: items per round (qverify.toml's limit; None: toolcall's 60)."""
    rules = {f"{SUITE}/{METRIC}": MetricRule(tolerance=tol), f"{SUITE}/trigger": MetricRule(gate=False, tolerance=tol)}
    return QVerifyConfig(suites=[SUITE], report=False, thresholds=rules, limit=first, **kw)


@dataclass
class World:
    """One trial's items and answers: what the builds would score, drawn when first asked for."""

    seed: int
    delta: float
    nmax: int = 2000
    kmax: int = 12
    clock: float = 0.0  # simulated seconds of generation so far
    requests: int = 0
    _draws: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rng = np.random.default_rng([self.seed, 0])
        self.p = rng.beta(*BETA, self.nmax)
        lost = rng.random(self.nmax) < -self.delta / (BETA[0] / sum(BETA))
        self.q = np.where(lost, 0.0, self.p)

    def answers(self, build: str, salt: int) -> np.ndarray:
        """nmax x kmax 0/1: the build's score of each item and replicate under the salt's seeds."""
        if salt not in self._draws:
            rng = np.random.default_rng([self.seed, 1, salt])
            ub = rng.random((self.nmax, self.kmax))
            uc = np.where(rng.random(ub.shape) < COUPLING, ub, rng.random(ub.shape))
            self._draws[salt] = ((ub < self.p[:, None]).astype(float), (uc < self.q[:, None]).astype(float))
        return self._draws[salt][0 if build == BASE else 1]


_ITEMS: dict[tuple, list] = {}
_SET = ("item_id", "suite", "replicate", "seed", "request_hash", "response", "scores")
_DEFAULTS = {k: f.get_default(call_default_factory=True) for k, f in ItemResult.model_fields.items() if k not in _SET}


def _items(split: str, n: int, seed: int, source: str) -> list:
    """toolcall's first n items, generated once per process: the generator is deterministic and extends, never
    reshuffles, so the first n of a longer list are the same items (generating them again each round was 90% of a
    trial's time)."""
    from qverify.suites import get_suite

    have = _ITEMS.get((split, seed, source), [])
    if len(have) < n:
        have = _ITEMS[(split, seed, source)] = get_suite(SUITE).items(split, max(n, 2 * len(have), 1024), seed=seed,
                                                                        source=source)
    return have[:n]


def evaluate_build(wd: Workdir, build: str, spec, world: World) -> None:
    """pipeline.evaluate_build without a server: simulated answers appended to the real store.

    Where the stored run is not one this evaluation may grow (another seed salt, more items than asked, --fresh)
    the real pipeline.make_plan runs first, so that the runner's own check refuses it (or moves a --fresh run
    aside) exactly as `qverify eval` / the gate's rounds would. Otherwise the run is grown as the runner grows it
    (every pending (item, replicate) appended to r<k>.jsonl in the store's format, the manifest rewritten and
    closed complete with no errors), without re-reading what is stored: the runner's reads are generation's
    cost, not the gate's, and they made a trial seconds long."""
    from qverify.evals.runner import item_set_hash, replicate_seed
    from qverify.models import utcnow
    from qverify.suites import get_suite

    build_dir, manifest = wd.resolve_build(build)
    suite = get_suite(SUITE)
    st = RunStore(wd.run_dir(manifest.build_id, SUITE))
    old = st.read_manifest()
    n = spec.limit or suite.default_n
    if old is not None and (old.seed_salt != spec.seed_salt or old.n_items > n or spec.fresh):
        from qverify.pipeline import make_plan

        make_plan(wd, build_dir, manifest, spec)  # refuses (BadInput), or moves a --fresh run aside
        old = st.read_manifest()
    items = _items("test", n, 0, spec.source)
    had_n, had_k = (old.n_items, old.replicates) if old is not None else (0, 0)
    m = RunManifest(build_id=manifest.build_id, suite=SUITE, suite_version=suite.version,
                    item_set_hash=item_set_hash(items), n_items=len(items), replicates=spec.replicates,
                    split="test", source=spec.source, sampling=suite.sent_sampling(),
                    serving=spec.serving or ServingProfile(), error_budget=spec.error_budget,
                    seed_salt=spec.seed_salt, served_model=build, complete=True, error_rate=0.0,
                    answered_models=[build])
    if old is not None:
        m.started = old.started
    x = world.answers(build, spec.seed_salt)
    st.dir.mkdir(parents=True, exist_ok=True)
    written = 0
    resp = Response.model_construct(content="", finish_reason="stop", model=build,
                                    **{k: f.get_default(call_default_factory=True) for k, f in Response.model_fields.items()
                                       if k not in ("content", "finish_reason", "model")})
    for r in range(spec.replicates):
        start = had_n if r < had_k else 0
        if start >= len(items):
            continue
        with open(st.replicate_path(r), "a") as f:
            for i in range(start, len(items)):
                # model_construct: the record's full format without validating what was just made (a second's
                # worth of validation per trial); the gate's read validates every line as it does a runner's
                f.write(ItemResult.model_construct(
                    item_id=items[i].id, suite=SUITE, replicate=r, seed=replicate_seed(items[i].id, r, spec.seed_salt),
                    request_hash="sim", response=resp, scores={METRIC: float(x[i, r]), "trigger": 1.0},
                    **_DEFAULTS).model_dump_json() + "\n")
                written += 1
    m.finished = utcnow()
    st.write_manifest(m)
    world.requests += written
    world.clock += written * SECONDS_PER_REQUEST


def evaluator(world: World):
    """Stands in for qverify.rounds._evaluator: the same rounds (one EvalSpec per distinct items and replicates, as
    there), evaluated by evaluate_build above."""
    from qverify.pipeline import serving_profile

    def make(wd, cfg, baseline, candidates, suites, show_progress, warn):
        serving = serving_profile(cfg.serving)

        def evaluate(builds: list[str], want: dict[str, int], reps: dict[str, int]) -> None:
            for spec in rounds.round_specs(cfg, want, reps, serving):
                for b in builds:
                    evaluate_build(wd, b, spec, world)

        return evaluate, []

    return make


@contextmanager
def simulated(world: World) -> Iterator[None]:
    """Generation simulated (no model is run: scores are drawn from the item model) and a time budget's clock
    simulated with it; everything else is the CLI's code."""
    real = rounds.run_sequence
    with mock.patch.object(rounds, "_evaluator", evaluator(world)), \
            mock.patch.object(rounds, "run_sequence", partial(real, clock=lambda: world.clock)):
        yield


@dataclass
class Trial:
    """One user's procedure: a workdir, the world its builds answer from, and the exit code of every gate."""

    world: World
    cfg: QVerifyConfig
    root: Path
    codes: list[int] = field(default_factory=list)
    reports: list = field(default_factory=list)

    @property
    def wd(self) -> Workdir:
        return Workdir.at(self.root / "wd")

    def gate(self, budget: str | None = None, fixed: bool = False, **cfg_update) -> int:
        """`qverify gate --baseline base --candidate cand [--budget B | --fixed]`: the exit code (4: refused)."""
        cfg = self.cfg.model_copy(update=cfg_update) if cfg_update else self.cfg
        ask = rounds.GateAsk(baseline=BASE, candidates=(CAND,), budget=budget, fixed=fixed)
        try:
            with simulated(self.world):
                report = rounds.gate(self.wd, cfg, ask, out=Output(json_mode=True))
            code = exit_code(report)
            self.reports.append(report)
        except BadInput as e:
            code = 4
            self.reports.append(e)
        self.codes.append(code)
        return code

    def evaluate(self, n: int, fresh: bool = False, **cfg_update) -> None:
        """`qverify eval` of both builds to the first n items (`fresh`: started over, as --fresh): the runs grown."""
        from qverify.pipeline import EvalSpec

        cfg = self.cfg.model_copy(update=cfg_update) if cfg_update else self.cfg
        spec = EvalSpec.from_config(cfg, suites=[SUITE], limit=n, grow=not fresh, fresh=fresh)
        for b in (BASE, CAND):
            evaluate_build(self.wd, b, spec, self.world)

    def copy_runs(self) -> None:
        """The runs (and build.json files) copied into a new workdir, which the trial goes on in; gates/ is left."""
        new = self.root / f"wd{len(list(self.root.iterdir()))}"
        shutil.copytree(self.wd.runs, new / "runs")
        shutil.copytree(self.wd.builds, new / "builds")
        shutil.rmtree(self.root / "wd")
        new.rename(self.root / "wd")

    @contextmanager
    def fork(self) -> Iterator[Trial]:
        """A copy of this trial's state (its workdir, its answers) to go on from along another route."""
        with tempfile.TemporaryDirectory(dir=self.root.parent) as d:
            shutil.copytree(self.root / "wd", Path(d) / "wd", symlinks=True)
            yield Trial(copy.copy(self.world), self.cfg, Path(d), list(self.codes), list(self.reports))

    @property
    def passed(self) -> bool:
        return 0 in self.codes

    @property
    def failed(self) -> bool:
        return 1 in self.codes

    @property
    def refused(self) -> bool:
        return 4 in self.codes


@contextmanager
def trial(seed: int, delta: float, cfg: QVerifyConfig, tmp: Path | None = None) -> Iterator[Trial]:
    base = Path(tmp) if tmp else (Path("/dev/shm") if Path("/dev/shm").is_dir() else None)
    with tempfile.TemporaryDirectory(dir=base) as d:
        wd = Workdir.at(Path(d) / "wd").ensure()
        for b in (BASE, CAND):
            synth.write_build(wd.builds, b, recipe=b)
        yield Trial(World(seed, delta), cfg, Path(d))


def rounds_of(cfg: QVerifyConfig) -> int:
    """J, the default plan's looks for this config (qverify.gate.plan_size, as `qverify gate` sizes it)."""
    from qverify.gate.plan_size import plan_rounds

    first = rounds._first_look(cfg, [SUITE])
    return plan_rounds([SUITE], first, cfg.alpha, cfg.thresholds)


def first_items(cfg: QVerifyConfig) -> int:
    return rounds._first_look(cfg, [SUITE])[SUITE]


# --------------------------------------------------------------------------- the routes (each a user's procedure)
# Each route is a first gate and what the user does after it (a tail). The benchmark runs a first gate once per trial
# and each tail on a copy of its workdir (Trial.fork), so the routes that share a first gate share its trials.


def stopped_budget(t: Trial) -> dict:
    """A time budget that buys 3 rounds of the default plan's J looks (cfg.looks = J): stopped after look 3."""
    per_round = first_items(t.cfg) * t.cfg.replicates * 2 * SECONDS_PER_REQUEST
    return {"budget": f"{3.5 * per_round:g}s", "looks": rounds_of(t.cfg)}


def fixed_on_grown_runs(t: Trial) -> None:
    """(b)'s tail: if the stopped gate did not decide, the runs grown to the full plan's items, `gate --fixed`."""
    if t.codes[-1] == 2:
        t.evaluate(rounds_of(t.cfg) * first_items(t.cfg))
        t.gate(fixed=True)


def new_salt(t: Trial) -> None:
    """(c)'s tail: if INCONCLUSIVE, `qverify gate --seed-salt 7`; where the runner refuses runs of another salt,
    its fix, `qverify eval --fresh --seed-salt 7`, then the gate again."""
    if t.codes[-1] != 2:
        return
    if t.gate(seed_salt=7) == 4 and "seed salt" in str(t.reports[-1]):
        t.evaluate(first_items(t.cfg), fresh=True, seed_salt=7)
        t.gate(seed_salt=7)


def copied(t: Trial) -> None:
    """(e)'s tail: if it did not PASS, the runs copied into a new workdir and the default gate there."""
    if t.codes[-1] != 0:
        t.copy_runs()
        t.gate()


def fixed_every_round(t: Trial, gates: int = 12) -> None:
    """(d): runs grown by one round's items, gates/ deleted, `qverify gate --fixed`; again, up to `gates` gates,
    until one PASSes."""
    n1 = first_items(t.cfg)
    for g in range(1, gates + 1):
        shutil.rmtree(t.wd.gates, ignore_errors=True)
        t.evaluate(g * n1)
        if t.gate(fixed=True) == 0:
            return


# route -> (what the user does, the first gate's arguments (None: no shared first gate), the tail)
ROUTES: dict[str, tuple[str, Callable[[Trial], dict] | None, Callable[[Trial], None] | None]] = {
    "a": ("one budgeted sequence to its end (`qverify gate`)", lambda t: {}, None),
    "b": ("a time budget stopped after look 3 of the plan's J, then `gate --fixed` on the runs grown to J rounds' items",
          stopped_budget, fixed_on_grown_runs),
    "c": ("`qverify gate` INCONCLUSIVE, then `--seed-salt 7` (after `eval --fresh --seed-salt 7` where refused)",
          lambda t: {}, new_salt),
    "c2": ("(b)'s stopped gate INCONCLUSIVE (alpha left), then (c)'s new salt", stopped_budget, new_salt),
    "d": ("`gate --fixed` after every round's items, gates/ deleted before each, up to 12 gates", None, fixed_every_round),
    "e": ("`qverify gate`; if not PASS, the runs copied into a new workdir and `qverify gate` there", lambda t: {}, copied),
}


def run_route(t: Trial, key: str) -> Trial:
    """The whole route on a fresh trial (the tests; the benchmark shares first gates instead)."""
    _, first, tail = ROUTES[key]
    if first is not None:
        t.gate(**first(t))
    if tail is not None:
        tail(t)
    return t


@contextmanager
def ledger_bypassed() -> Iterator[None]:
    """The rule before the ledger: every gate at its full alpha (what a test of the routes must be able to see)."""
    with mock.patch("qverify.gate.ledger.remaining", lambda *a, **k: a[-1] if len(a) >= 6 else k["alpha"]):
        yield
