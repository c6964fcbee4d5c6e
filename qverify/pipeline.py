"""The pipeline build → serve → suites → runs, from one typed spec.

`EvalSpec` is what an evaluation runs: built from qverify.toml (`QVerifyConfig`, where every
default lives) with CLI flags overriding it. `evaluate_build` is what `qverify eval` calls;
`ensure_builds` is what `qverify gate --recipe` calls to build whatever is missing; qverify.rounds evaluates.
The benchmarks use the same two.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from qverify.config import QVerifyConfig, ServingConfig
from qverify.errors import BadInput
from qverify.evals.client import DEFAULT_CONCURRENCY, timeouts_for
from qverify.evals.lock import run_lock
from qverify.evals.runner import EvalPlan, SuiteSummary, run_plan, summarize
from qverify.models import BuildManifest, Endpoint, ServingProfile, canonical_split
from qverify.versions import RUN_PACKAGES, package_versions
from qverify.workdir import Workdir


@dataclass(frozen=True)
class EvalSpec:
    """One evaluation's settings. Build it with `from_config`; each default is QVerifyConfig's."""

    suites: list[str]
    replicates: int
    source: str
    concurrency: int | None  # None: the backend's default (evals.client.DEFAULT_CONCURRENCY)
    error_budget: float
    limit: int | None = None
    port: int | None = None
    serving: ServingProfile | None = None  # None: a bare local profile (ServingProfile())
    split: str = "test"
    fresh: bool = False
    grow: bool = False  # stored runs may be extended to a larger item set (`gate --budget` rounds)
    suite_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    connect_timeout_s: float | None = None  # None: the backend's default (evals.client.DEFAULT_TIMEOUTS)
    read_timeout_s: float | None = None
    item_timeout_s: float | None = None
    allow_unsandboxed: bool = False
    seed_salt: int = 0  # replicate seeds' salt (qverify.evals.runner.replicate_seed)
    trust_remote_code: bool = False  # the user's permission for a build's own code; never read from build.json

    @classmethod
    def from_config(cls, cfg: QVerifyConfig | None = None, **overrides: Any) -> EvalSpec:
        """qverify.toml's settings, then every override that is not None (a flag left unset)."""
        cfg = cfg or QVerifyConfig()
        spec = cls(suites=list(cfg.suites), replicates=cfg.replicates, source=cfg.source,
                   concurrency=cfg.serving.concurrency, error_budget=cfg.error_budget, limit=cfg.limit,
                   port=cfg.serving.port, connect_timeout_s=cfg.client.connect_timeout_s,
                   read_timeout_s=cfg.client.read_timeout_s, item_timeout_s=cfg.client.item_timeout_s,
                   allow_unsandboxed=cfg.allow_unsandboxed, seed_salt=cfg.seed_salt, suite_options=dict(cfg.suite_options),
                   trust_remote_code=cfg.trust_remote_code)
        return spec.override(**overrides)

    def override(self, **overrides: Any) -> EvalSpec:
        known = {f.name for f in fields(self)}
        unknown = set(overrides) - known
        if unknown:
            raise TypeError(f"EvalSpec has no field {', '.join(sorted(unknown))}")
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})


def serving_profile(sv: ServingConfig, backend: str | None = None, profile: str | None = None,
                    endpoint: str | None = None, api_key_env: str | None = None,
                    served_model: str | None = None) -> ServingProfile:
    """The serving profile from qverify.toml's [serving], flags overriding it: the one resolution that
    `qverify eval` and the gate (qverify.rounds, fixed and budgeted) both use.

    The config's backend counts only when the file sets it: `--endpoint URL` alone still means
    the endpoint backend, as without a config.
    """
    from qverify.serve.profile import resolve_profile

    if backend is None and "backend" in sv.model_fields_set:
        backend = sv.backend
    prof = resolve_profile(backend, profile or sv.profile, endpoint or sv.endpoint, api_key_env or sv.api_key_env)
    declared = served_model or sv.served_model
    if declared:
        if prof.backend != "endpoint":
            raise BadInput(f"--served-model applies to the endpoint backend, not {prof.backend} (a server qverify "
                           "launches serves the build under its id)", fix="drop --served-model")
        prof = prof.model_copy(update={"served_model": declared})
    return prof


def token_counter(build_dir: Path, trust_remote_code: bool = False) -> Callable[[str], int]:
    """Counts tokens with the build's tokenizer, loaded on first use: only suites that size prompts
    by tokens need it, and importing transformers costs seconds a failing or no-op eval should not pay."""
    tok = None

    def count(s: str) -> int:
        nonlocal tok
        if tok is None:
            from transformers import AutoTokenizer

            # a Kimi build's tokenizer is remote code: allowed when the build needs it and the user allowed it
            tok = AutoTokenizer.from_pretrained(build_dir, trust_remote_code=trust_remote_code)
        return len(tok(s, add_special_tokens=False)["input_ids"])

    return count


def make_plan(workdir: Workdir, build_dir: Path, manifest: BuildManifest, spec: EvalSpec) -> EvalPlan:
    from qverify.suites import get_suite

    if spec.replicates < 1:
        raise BadInput(f"--replicates must be >= 1 (got {spec.replicates})", fix="pass --replicates 3 or more for gating")
    try:
        split = canonical_split(spec.split)
    except ValueError:
        raise BadInput(f"unknown split {spec.split!r}", fix="use --split test (or validation, train)") from None
    count = token_counter(build_dir, manifest.remote_code(spec.trust_remote_code))
    serving = spec.serving or ServingProfile()
    backend = spec.serving.backend if spec.serving else "local"
    objs, items = [], {}
    for name in spec.suites:
        # the profile's per-model request settings (chat_template_kwargs, output budget), then explicit options
        s = get_suite(name, count_tokens=count, **(serving.request_options(name) | spec.suite_options.get(name, {})))
        if spec.source not in s.sources:
            raise BadInput(f"suite {name} has no item source {spec.source!r}", fix=f"use one of: {', '.join(s.sources)}")
        s.allow_unsandboxed = spec.allow_unsandboxed
        objs.append(s)
        items[name] = s.items(split, spec.limit or s.default_n, source=spec.source)[: spec.limit or None]
    for name in spec.suites:
        workdir.run_dir(manifest.build_id, name)  # refuses a run folder outside the workdir
    plan = EvalPlan(build_id=manifest.build_id, manifest=manifest, suites=objs, items=items, replicates=spec.replicates,
                    runs_root=workdir.runs, serving=serving, concurrency=spec.concurrency or DEFAULT_CONCURRENCY[backend],
                    error_budget=spec.error_budget, split=split, source=spec.source, fresh=spec.fresh,
                    timeouts=timeouts_for(backend, spec.connect_timeout_s,
                                          spec.read_timeout_s, spec.item_timeout_s),
                    allow_unsandboxed=spec.allow_unsandboxed, grow=spec.grow, seed_salt=spec.seed_salt)
    plan.check_existing()
    return plan


def evaluate_build(workdir: Workdir, build_ref: str | Path, suites: list[str] | None = None, *,
                   spec: EvalSpec | None = None, show_progress: bool = True,
                   on_ready: Callable[[Endpoint], None] | None = None, warn: Callable[[str], None] | None = None,
                   **overrides: Any) -> list[SuiteSummary]:
    """Start (or attach to) the build's server once, run every pending suite × replicate, stop it.

    `spec` defaults to qverify.toml's defaults; `suites` and keyword `overrides` (EvalSpec fields) replace parts of it.
    Results already complete are a no-op: nothing is written and no server is needed.
    """
    spec = (spec or EvalSpec.from_config()).override(suites=suites, **overrides)
    serving = spec.serving or ServingProfile()
    build_dir, manifest = workdir.resolve_build(build_ref)
    manifest.remote_code(spec.trust_remote_code)  # exit 4 before anything of the build is imported
    with ExitStack() as locks:  # one process owns each run, from the check of what is stored to the last write
        for name in spec.suites:
            locks.enter_context(run_lock(workdir.run_dir(manifest.build_id, name), f"runs/{manifest.build_id}/{name}"))
        return _evaluate_locked(workdir, build_dir, manifest, spec, serving, show_progress, on_ready, warn)


def _evaluate_locked(workdir: Workdir, build_dir: Path, manifest: BuildManifest, spec: EvalSpec, serving: ServingProfile,
                     show_progress: bool, on_ready: Callable[[Endpoint], None] | None,
                     warn: Callable[[str], None] | None) -> list[SuiteSummary]:
    from qverify.serve import get_backend

    plan = make_plan(workdir, build_dir, manifest, spec)
    pending = plan.pending()
    closed = {s.name: m for s in plan.suites if (m := plan.store(s.name).read_manifest()) and m.finished}
    if not any(pending.values()) and len(closed) == len(plan.suites):
        return [summarize(plan.store(s.name), s, closed[s.name]) for s in plan.suites]
    if any(s.runs_model_code and pending[s.name] for s in plan.suites):
        from qverify.suites.sandbox import require_sandbox

        plan.sandbox = require_sandbox(spec.allow_unsandboxed)
        if plan.sandbox == "unsandboxed" and warn:
            warn("model code runs UNSANDBOXED (no bwrap here, allowed by --allow-unsandboxed): no filesystem or "
                 "network isolation; the run is marked and never gated against sandboxed runs")
    workdir.ensure()
    backend = get_backend(serving.backend)(build_dir, manifest, serving, workdir.logs, port=spec.port,
                                           trust_remote_code=spec.trust_remote_code)
    with backend as endpoint:
        if on_ready:
            on_ready(endpoint)
        return asyncio.run(run_plan(plan, endpoint, backend.redacted_command(), backend.info(), alive=backend.alive,
                                    versions=package_versions(RUN_PACKAGES), show_progress=show_progress, warn=warn))


def evaluate_builds(workdir: Workdir, build_refs: list[str], spec: EvalSpec, show_progress: bool = True,
                    warn: Callable[[str], None] | None = None, suites_by_build: dict[str, list[str]] | None = None) -> None:
    """Evaluate several builds on the same spec. On the embedded backend they run at the same time, each on
    its own one-thread server: the embedded server computes on one thread (torch.set_num_threads(1): more
    threads are slower at these sizes), so one build at a time left the other core of a 2-core box idle.
    A GPU server (sglang), a remote endpoint or a fixed --port runs them one after another. Progress bars
    are off when builds run together (one live display per terminal). `suites_by_build`: a build evaluated on
    fewer suites than the spec's (a twin, on greedy only)."""
    import os
    from concurrent.futures import ThreadPoolExecutor

    serving = spec.serving or ServingProfile()
    specs = {b: spec.override(suites=[s for s in spec.suites if s in suites_by_build[b]])
             if suites_by_build and b in suites_by_build else spec for b in build_refs}
    build_refs = [b for b in build_refs if specs[b].suites]
    workers = min(len(build_refs), os.cpu_count() or 1) if serving.backend == "local" and spec.port is None else 1
    if workers <= 1:
        for b in build_refs:
            evaluate_build(workdir, b, spec=specs[b], show_progress=show_progress, warn=warn)
        return
    # an error leaves the `with` only after the pool has waited for every build: their results are all written
    with ThreadPoolExecutor(workers, thread_name_prefix="eval") as pool:
        for f in [pool.submit(evaluate_build, workdir, b, spec=specs[b], show_progress=False, warn=warn) for b in build_refs]:
            f.result()


def suites_for_recipes(suites: list[str], recipes: list[str]) -> list[str]:
    """The configured suites, plus `greedy` when a candidate changes the drafter: its quality must then be
    unchanged under greedy decoding, which only the greedy-output comparison shows."""
    from qverify.quantize.recipe import load_recipe

    if "greedy" not in suites and any(load_recipe(r).recipe.serving.requires_drafter for r in recipes):
        return [*suites, "greedy"]
    return suites


def suites_for_builds(workdir: Workdir, suites: list[str], build_ids: list[str]) -> list[str]:
    """suites_for_recipes for builds already made: their build.json records what their recipe implies."""
    if "greedy" not in suites and any((m := workdir.build_manifest(b)) is not None and m.serving.get("requires_drafter")
                                      for b in build_ids):
        return [*suites, "greedy"]
    return suites


def ensure_twins(workdir: Workdir, baseline: str, candidates: list[str], say: Callable[[str], None] | None = None,
                 trust_remote_code: bool = False) -> list[str]:
    """Compose (or reuse) greedy/match's reference for each candidate that changes target and drafter together:
    its target with the baseline's drafter (qverify/quantize/twin.py; the gate finds it by content)."""
    from qverify.greedy_reference import reference_kind
    from qverify.quantize.twin import compose_twin

    base = workdir.build_manifest(baseline)
    twins = []
    for cand in candidates:
        m = workdir.build_manifest(cand)
        if base is None or m is None or reference_kind(base, m).kind != "twin":
            continue  # nothing to compose (where none can be, the gate refuses greedy/match and says why)
        r = compose_twin(workdir, baseline, cand, trust_remote_code=trust_remote_code)
        if say:
            say(f"  {'reused' if r.reused else 'composed'} {r.manifest.build_id} (greedy/match's reference: the target "
                f"of {cand}, the drafter of {baseline})")
        twins.append(r.manifest.build_id)
    return twins


def ensure_builds(workdir: Workdir, cfg: QVerifyConfig, baseline: str, candidates: list[str], out=None
                  ) -> tuple[str, list[str]]:
    """`qverify gate --recipe`: build the baseline and candidates if missing (content-addressed, so a second call
    reuses them); return build ids. The gate then evaluates them (qverify.rounds, the one evaluation flow)."""
    from qverify.quantize.build import build

    say = out.info if out is not None else (lambda m: None)
    quiet = bool(out is not None and out.json_mode)
    ids = []
    for recipe in [baseline, *candidates]:
        say(f"build {recipe} …")
        r = build(recipe, model=cfg.model, drafter=cfg.drafter, workdir=workdir.root, trust_remote_code=cfg.trust_remote_code,
                  calib_samples=cfg.calib_samples, calib_seq_len=cfg.calib_seq_len,
                  on_stage=None if quiet else (lambda stage, secs: say(f"  {stage} done in {secs:.1f}s") if secs is not None else None))
        say(f"  {'reused' if r.reused else 'built'} {r.manifest.build_id}")
        ids.append(r.manifest.build_id)
    return ids[0], ids[1:]
