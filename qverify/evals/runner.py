"""`qverify eval`: one server session per build, every suite × replicate, every item result stored.

Replicate r of item i is sampled with seed f(item id, r, salt), so baseline and candidate evaluated
with the same seed salt (default 0) pair exactly; requests go out concurrently so batch composition varies as in production.
Requests are ordered item-major (all replicates of a prompt adjacent) so a server's
prefix cache is reused. Rerunning after a crash continues where it stopped.
"""

from __future__ import annotations

import asyncio
import hashlib
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from qverify.errors import BadInput, InfraError
from qverify.evals.client import CallResult, Client, StreamTiming, Timeouts, stream_chat
from qverify.evals.store import RunStore
from qverify.interrupt import STOP
from qverify.models import BuildManifest, Endpoint, Item, ItemResult, RunManifest, ServingProfile, content_hash, utcnow
from qverify.suites.base import Suite, item_set_hash
from qverify.workdir import run_path


def replicate_seed(item_id: str, replicate: int, salt: int = 0) -> int:
    """The sampling seed of (item, replicate). Salt 0 is the historical key, so runs made before the salt
    existed keep their seeds and stay comparable; another salt gives every (item, replicate) fresh seeds,
    i.e. an independent session (the calibration benchmark's unit) that is still paired within itself."""
    key = f"{item_id}:{replicate}" if salt == 0 else f"{item_id}:{replicate}:salt{salt}"
    return int(hashlib.sha256(key.encode()).hexdigest()[:8], 16)


@dataclass
class SuiteSummary:
    suite: str
    metric: str
    mean: float | None
    replicate_means: list[float]
    errors: int
    results: int
    complete: bool
    tokens_per_s: float | None = None
    accept_length: float | None = None
    latency_s: float | None = None
    ttft_s: float | None = None

    def row(self) -> list[Any]:
        spread = (f"{min(self.replicate_means):.3f}–{max(self.replicate_means):.3f}" if self.replicate_means else "")
        return [self.suite, self.metric, None if self.mean is None else f"{self.mean:.3f}", spread,
                f"{self.errors}/{self.results}", "yes" if self.complete else "NO",
                None if self.tokens_per_s is None else f"{self.tokens_per_s:.0f}",
                None if self.accept_length is None else f"{self.accept_length:.2f}",
                None if self.ttft_s is None else f"{1000 * self.ttft_s:.0f}"]


@dataclass
class EvalPlan:
    build_id: str
    manifest: BuildManifest | None
    suites: list[Suite]
    items: dict[str, list[Item]]
    replicates: int
    runs_root: Path
    serving: ServingProfile
    concurrency: int  # defaults: qverify.config.QVerifyConfig, through qverify.pipeline.EvalSpec
    error_budget: float
    split: str = "test"
    source: str = "synthetic"
    fresh: bool = False
    grow: bool = False  # a stored run may be extended to a larger item set (the sequential gate's rounds)
    perf_probes: int = 4  # streamed requests per suite, one at a time, for TTFT (0: off)
    timeouts: Timeouts | None = None  # None: the client's defaults for the embedded server
    allow_unsandboxed: bool = False
    sandbox: str | None = None  # where model code runs: "bwrap" | "unsandboxed" (set before suites that run it)
    seed_salt: int = 0  # replicate_seed's salt: 0 = the historical seeds; recorded in each run manifest
    summaries: list[SuiteSummary] = field(default_factory=list)

    def store(self, suite: str) -> RunStore:
        return RunStore(run_path(self.runs_root, self.build_id, suite))

    def pending(self) -> dict[str, list[tuple[Item, int]]]:
        out = {}
        for s in self.suites:
            st = self.store(s.name)
            todo = []
            done = {r: st.done_ids(r) for r in range(self.replicates)}
            for it in self.items[s.name]:
                todo += [(it, r) for r in range(self.replicates) if it.id not in done[r]]
            out[s.name] = todo
        return out

    def check_existing(self) -> None:
        """Results on disk must be for the same items, suite version and sampling, or we refuse to mix them."""
        for s in self.suites:
            m = self.store(s.name).read_manifest()
            if m is None:
                continue
            if m.seed_salt != self.seed_salt and not self.fresh:
                # one run is one seed sequence: resuming or growing it under another salt would mix two sessions
                raise BadInput(f"runs/{self.build_id}/{s.name} was sampled with seed salt {m.seed_salt}, not {self.seed_salt}",
                               fix=f"pass --seed-salt {m.seed_salt} to resume or grow it, or --fresh to start it over")
            same = (m.suite_version == s.version and m.item_set_hash == item_set_hash(self.items[s.name])
                    and m.sampling == s.sent_sampling() and m.seed_salt == self.seed_salt
                    and m.serving.served_model == self.serving.served_model)  # a new declared identity: a new run
            if not same and self.grow and m.suite_version == s.version and m.sampling == s.sent_sampling():
                # the sequential gate's next round: more items of the same suite; every result already
                # stored must be for an item of the new, larger set (the generators extend, never reshuffle)
                ids = {it.id for it in self.items[s.name]}
                if all(self.store(s.name).done_ids(r) <= ids for r in range(self.replicates)):
                    continue
            if not same and not self.fresh:
                # `qverify gate` has no --fresh of its own (a gate never discards runs), so name the command. The
                # gate's rounds (grow) never advise another workdir: there no ledger counts the looks already taken
                # (qverify.gate.ledger), so a gate there would test the same hypothesis at a fresh alpha
                raise BadInput(f"runs/{self.build_id}/{s.name} holds results for another item set, suite version or sampling",
                               fix=f"`qverify eval {self.build_id} --suites {s.name} --fresh` starts that suite over (the old "
                                   "results are moved aside" + ("; the gate's record of its looks stays)" if self.grow
                                                                else "), or use another --workdir"))
            if not same:
                old = self.store(s.name).dir
                old.rename(old.with_name(f"{old.name}.old-{int(time.time())}"))


async def _server_gone(alive) -> bool:
    """Dead only if two liveness checks 2 s apart fail: a busy server can miss one health probe."""
    if alive():
        return False
    await asyncio.sleep(2)
    return not alive()


async def _one(client: Client, suite: Suite, item: Item, r: int, salt: int = 0) -> ItemResult:
    seed = replicate_seed(item.id, r, salt)
    body = suite.request(item)
    body["seed"] = seed
    body["return_meta_info"] = True  # SGLang: per-request spec_accept_length; ignored elsewhere
    res: CallResult = await client.call(body, kind="completion" if item.kind == "completion" else "chat")
    if res.response is not None and suite.sampling.logprobs and not res.response.logprobs:
        # a metric over logprobs (KL) would otherwise be computed on the items that happen to have them: a
        # response without what the suite asked for is this item's error, counted against the error budget
        res = CallResult(None, "no_logprobs", res.latency_s, res.attempts,
                         "the suite asked for logprobs and the response has none (does the server support them?)")
    ir = ItemResult(item_id=item.id, suite=suite.name, replicate=r, seed=seed, request_hash=content_hash(body),
                    response=res.response, error=res.error, latency_s=round(res.latency_s, 4),
                    metadata={"attempts": res.attempts, **({"error_detail": res.detail} if res.error else {})})
    if res.response is not None:
        score = await asyncio.to_thread(suite.safe_score, item, res.response)  # sandboxes block; keep the loop free
        ir.scores, ir.reason = score.values, score.reason
        accept = res.response.meta_info.get("spec_accept_length")
        if isinstance(accept, (int, float)) and not isinstance(accept, bool):
            ir.accept_length = float(accept)
    return ir


async def _run_itself(plan: EvalPlan, suite: Suite, endpoint: Endpoint, todo: list[tuple[Item, int]],
                      writers: dict, advance) -> None:
    """A suite that requests and scores its own items (Suite.runs_itself; lmeval:<task>): one run() per replicate
    with pending items, every request of it sampled with that replicate's seed (the same on every build, so
    replicates pair); only results for pending items are written, so a rerun resumes without duplicates."""
    n = len(plan.items[suite.name])
    for r in sorted({r for _, r in todo}):
        pending = {it.id for it, rr in todo if rr == r}
        results = await asyncio.to_thread(suite.run, endpoint, r, replicate_seed(suite.name, r, plan.seed_salt), n or None)
        for ir in results:
            if ir.item_id in pending:
                writers[r].append(ir)
                advance()


async def perf_probe(client: Client, suite: Suite, items: list[Item], n: int, salt: int = 0) -> dict[str, float]:
    """TTFT and decode speed from `n` streamed requests sent one at a time (an unloaded server).

    Separate from the scored requests on purpose: streaming changes how a response is
    assembled, and quality is scored on exactly the non-streamed path a user's eval uses.
    """
    chats = [it for it in items if it.kind != "completion"][:n]
    timings: list[StreamTiming] = []
    for it in chats:
        body = suite.request(it)
        body["seed"] = replicate_seed(it.id, 0, salt)
        timings.append(await stream_chat(client, body))
    ttft = sorted(t.ttft_s for t in timings if t.error is None and t.ttft_s is not None)
    dec = [d for t in timings if t.error is None and (d := t.decode_tok_s) is not None]
    out: dict[str, float] = {}
    if ttft:
        out["ttft_s"] = round(statistics.median(ttft), 5)
        out["ttft_max_s"] = round(ttft[-1], 5)
    if dec:
        out["stream_decode_tok_s"] = round(statistics.median(dec), 2)
    return out


async def run_plan(plan: EvalPlan, endpoint: Endpoint, server_command: list[str] | None, server_info: dict,
                   alive=lambda: True, versions: dict | None = None, show_progress: bool = True,
                   warn=None) -> list[SuiteSummary]:
    """Every pending item of every suite; stops within a fraction of a second of qverify.interrupt.STOP
    (Ctrl-C or SIGTERM, also on a worker thread), results written so far flushed and kept."""
    main = asyncio.ensure_future(_run_plan(plan, endpoint, server_command, server_info, alive, versions,
                                           show_progress, warn))
    watch = asyncio.ensure_future(_cancel_on_stop(main))
    try:
        return await main
    except asyncio.CancelledError:
        if STOP.is_set():
            raise KeyboardInterrupt from None  # the command's handler words it (qverify.cli.main)
        raise
    finally:
        watch.cancel()


async def _cancel_on_stop(task: asyncio.Future) -> None:
    while not STOP.is_set():
        await asyncio.sleep(0.2)
    task.cancel()


async def _run_plan(plan: EvalPlan, endpoint: Endpoint, server_command: list[str] | None, server_info: dict,
                    alive, versions: dict | None, show_progress: bool, warn) -> list[SuiteSummary]:
    client = Client(endpoint, concurrency=plan.concurrency, timeouts=plan.timeouts)
    pending = plan.pending()
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                      disable=not show_progress, transient=False) as prog:
            for suite in plan.suites:
                st = plan.store(suite.name)
                m = RunManifest(build_id=plan.build_id, suite=suite.name, suite_version=suite.version,
                                item_set_hash=item_set_hash(plan.items[suite.name]), n_items=len(plan.items[suite.name]),
                                replicates=plan.replicates, split=plan.split, source=plan.source, sampling=suite.sent_sampling(),
                                serving=plan.serving, server_command=server_command, server_info=server_info,
                                versions=versions or {}, error_budget=plan.error_budget,
                                sandbox=plan.sandbox if suite.runs_model_code else None, seed_salt=plan.seed_salt,
                                served_model=endpoint.model, listed_models=endpoint.listed_models)
                old = st.read_manifest()
                if old is not None:
                    m.started = old.started
                    if old.sandbox and m.sandbox and old.sandbox != m.sandbox:
                        raise InfraError(f"runs/{plan.build_id}/{suite.name} was scored {old.sandbox}, this run would "
                                         f"be {m.sandbox}; one run never mixes the two",
                                         fix="run where bwrap works, or pass --fresh to start that suite over")
                st.write_manifest(m)
                todo = pending[suite.name]
                task = prog.add_task(f"{suite.name} ×{plan.replicates}", total=len(plan.items[suite.name]) * plan.replicates,
                                     completed=len(plan.items[suite.name]) * plan.replicates - len(todo))
                writers = {r: st.writer(r).__enter__() for r in range(plan.replicates)}
                for r, w in writers.items():
                    if w.quarantined and warn:
                        warn(f"runs/{plan.build_id}/{suite.name}/r{r}.jsonl: {w.quarantined} damaged line(s) moved to "
                             f"{w.path.stem}.quarantine.jsonl; every valid result is kept and those items run again")
                try:
                    if suite.runs_itself:
                        await _run_itself(plan, suite, endpoint, todo, writers, lambda t=task: prog.advance(t))
                    for coro in asyncio.as_completed([] if suite.runs_itself else
                                                     [_one(client, suite, it, r, plan.seed_salt) for it, r in todo]):
                        ir = await coro
                        writers[ir.replicate].append(ir)
                        prog.advance(task)
                        if ir.error in ("connection", "timeout") and await _server_gone(alive):
                            raise InfraError(f"the server died during suite {suite.name}",
                                             fix="see the server log under <workdir>/logs/, then rerun the same command to resume")
                finally:
                    for w in writers.values():
                        w.__exit__(None, None, None)
                # timing a server that answered nothing in this suite would only add timeouts
                answered = any(r.error is None for rs in st.all_results().values() for r in rs)
                probe = (await perf_probe(client, suite, plan.items[suite.name], plan.perf_probes, plan.seed_salt)
                         if plan.perf_probes and answered else {})
                plan.summaries.append(finalize(st, suite, m, probe))
    finally:
        await client.close()
    _require_identity(plan, endpoint)
    return plan.summaries


def _require_identity(plan: EvalPlan, endpoint: Endpoint) -> None:
    """Exit 3 (results kept) when an endpoint named no model: nothing would show which model answered, and one
    canned server "serving" two builds gated PASS. The gate refuses such runs too (gate/integrity.py)."""
    for suite in plan.suites:
        m = plan.store(suite.name).read_manifest()
        if m is not None and m.model_identity() is None and any(
                r.error is None for rs in plan.store(suite.name).all_results().values() for r in rs):
            raise InfraError(
                f"the endpoint named no model: its answers carry no `model` and /v1/models lists none, so nothing "
                f"shows which model answered (results kept in runs/{plan.build_id}/)",
                fix=f"serve it under a name (sglang --served-model-name {plan.build_id}), or declare what it serves: "
                    f"rerun the same command with --served-model {plan.build_id} --fresh")


def finalize(st: RunStore, suite: Suite, m: RunManifest, probe: dict[str, float] | None = None) -> SuiteSummary:
    """Close a suite's run: error rate against the budget, completeness, performance, summary."""
    _close(st, m, probe)
    m.finished = utcnow()
    st.write_manifest(m)
    return summarize(st, suite, m)


def _close(st: RunStore, m: RunManifest, probe: dict[str, float] | None) -> None:
    allres = st.all_results()
    flat = [r for rs in allres.values() for r in rs]
    errors = sum(1 for r in flat if r.error)
    expected = m.n_items * m.replicates
    m.error_rate = errors / max(expected, 1)
    m.complete = len(flat) >= expected and m.error_rate <= m.error_budget
    ok = [r for r in flat if r.error is None and r.response is not None]
    m.answered_models = sorted({r.response.model for r in ok if r.response.model})
    lat = [r.latency_s for r in ok if r.latency_s]
    toks = sum(r.response.usage.get("completion_tokens", 0) for r in ok)
    acc = [r.accept_length for r in ok if r.accept_length]
    m.perf = {k: v for k, v in {
        "latency_mean_s": statistics.fmean(lat) if lat else None,
        "decode_tok_per_s_per_request": (toks / sum(lat)) if lat and toks else None,
        "accept_length": statistics.fmean(acc) if acc else None,
        "completion_tokens": float(toks), **(probe or {})}.items() if v is not None}


def summarize(st: RunStore, suite: Suite, m: RunManifest) -> SuiteSummary:
    """The summary of a closed run, read from disk; writes nothing (a complete eval is a no-op)."""
    allres = st.all_results()
    errors = sum(1 for rs in allres.values() for r in rs if r.error)
    metric = suite.primary_metric
    if suite.runs_itself and not any(metric in x.scores for rs in allres.values() for x in rs):
        # lm-eval names a task's metrics only when it scores (LmEvalSuite._to_results): the stored results say
        metric = next((k for rs in allres.values() for x in rs for k in x.scores), metric)
    rep_means = []
    for r in sorted(allres):
        vals = [x.scores[metric] for x in allres[r] if x.error is None and metric in x.scores]
        if vals:
            rep_means.append(sum(vals) / len(vals))
    return SuiteSummary(suite=suite.name, metric=metric,
                        mean=statistics.fmean(rep_means) if rep_means else None, replicate_means=rep_means,
                        errors=errors, results=sum(len(rs) for rs in allres.values()), complete=m.complete,
                        tokens_per_s=m.perf.get("decode_tok_per_s_per_request"), accept_length=m.perf.get("accept_length"),
                        latency_s=m.perf.get("latency_mean_s"), ttft_s=m.perf.get("ttft_s"))
