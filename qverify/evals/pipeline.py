"""Phases as plain functions: resolve a build → serve it once → run suites → (gate).

`evaluate_build` is what `qverify eval` calls; `ensure_runs` is what `qverify gate --recipe`
calls to build and evaluate whatever is missing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from qverify.errors import BadInput
from qverify.evals.runner import EvalPlan, SuiteSummary, run_plan
from qverify.models import BuildManifest, Endpoint, ServingProfile
from qverify.workdir import Workdir, resolve_build


def token_counter(build_dir: Path) -> Callable[[str], int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(build_dir)
    return lambda s: len(tok(s, add_special_tokens=False)["input_ids"])


def make_plan(workdir: Workdir, build_dir: Path, manifest: BuildManifest, suites: list[str], replicates: int,
              serving: ServingProfile, limit: int | None = None, split: str = "held-out", source: str = "synthetic",
              concurrency: int = 8, error_budget: float = 0.02, fresh: bool = False,
              suite_options: dict[str, dict[str, Any]] | None = None, grow: bool = False) -> EvalPlan:
    from qverify.suites import get_suite

    if replicates < 1:
        raise BadInput(f"--replicates must be >= 1 (got {replicates})", fix="pass --replicates 3 or more for gating")
    if split not in ("held-out", "train"):
        raise BadInput(f"unknown split {split!r}", fix="use --split held-out")
    count = token_counter(build_dir)
    objs, items = [], {}
    for name in suites:
        s = get_suite(name, count_tokens=count, **(suite_options or {}).get(name, {}))
        if source not in s.sources:
            raise BadInput(f"suite {name} has no item source {source!r}", fix=f"use one of: {', '.join(s.sources)}")
        objs.append(s)
        items[name] = s.items(split, limit or s.default_n, source=source)[: limit or None]
    plan = EvalPlan(build_id=manifest.build_id, manifest=manifest, suites=objs, items=items, replicates=replicates,
                    runs_root=workdir.runs, serving=serving, concurrency=concurrency, error_budget=error_budget,
                    split=split, source=source, fresh=fresh, grow=grow)
    plan.check_existing()
    return plan


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for p in ("qverify", "torch", "transformers", "compressed-tensors", "llmcompressor", "sglang"):
        try:
            out[p] = version(p)
        except PackageNotFoundError:
            pass
    return out


def evaluate_build(workdir: Workdir, build_ref: str | Path, suites: list[str], replicates: int = 3,
                   serving: ServingProfile | None = None, limit: int | None = None, split: str = "held-out",
                   source: str = "synthetic", concurrency: int = 8, error_budget: float = 0.02, port: int | None = None,
                   fresh: bool = False, show_progress: bool = True, on_ready: Callable[[Endpoint], None] | None = None,
                   suite_options: dict[str, dict[str, Any]] | None = None, grow: bool = False) -> list[SuiteSummary]:
    """Start (or attach to) the build's server once, run every pending suite × replicate, stop it."""
    from qverify.serve import get_backend

    workdir.ensure()
    serving = serving or ServingProfile()
    build_dir, manifest = resolve_build(workdir, build_ref)
    plan = make_plan(workdir, build_dir, manifest, suites, replicates, serving, limit, split, source, concurrency,
                     error_budget, fresh, suite_options, grow)
    if not any(plan.pending().values()):
        from qverify.evals.runner import finalize

        return [finalize(plan.store(s.name), s, plan.store(s.name).read_manifest()) for s in plan.suites]
    backend = get_backend(serving.backend)(build_dir, manifest, serving, workdir.logs, port=port)
    with backend as endpoint:
        if on_ready:
            on_ready(endpoint)
        cmd = backend.redacted_command() if hasattr(backend, "redacted_command") else backend.command()
        return asyncio.run(run_plan(plan, endpoint, cmd, backend.info(), alive=backend.alive,
                                    versions=_versions(), show_progress=show_progress))


def suites_for_recipes(suites: list[str], recipes: list[str]) -> list[str]:
    """The configured suites, plus `greedy` when a candidate changes the drafter: its quality must then be
    unchanged under greedy decoding, which only the greedy-output comparison shows."""
    from qverify.quantize.recipe import load_recipe

    if "greedy" not in suites and any(load_recipe(r).recipe.serving.requires_drafter for r in recipes):
        return [*suites, "greedy"]
    return suites


def ensure_runs(workdir: Workdir, cfg, baseline: str, candidates: list[str], suites: list[str], out=None,
                evaluate: bool = True) -> tuple[str, list[str]]:
    """`qverify gate --recipe`: build the baseline and candidates if missing, run missing evals, return build ids.

    Builds are content-addressed, so a second call reuses them; evals resume, so only what
    is missing runs.
    """
    from qverify.quantize.build import build
    from qverify.serve.profile import resolve_profile

    say = out.info if out is not None else (lambda m: None)
    quiet = bool(out is not None and out.json_mode)
    results = []
    for recipe in [baseline, *candidates]:
        say(f"build {recipe} …")
        r = build(recipe, model=cfg.model, drafter=cfg.drafter, workdir=workdir.root,
                  on_stage=None if quiet else (lambda stage, secs: say(f"  {stage} done in {secs:.1f}s") if secs is not None else None))
        say(f"  {'reused' if r.reused else 'built'} {r.manifest.build_id}")
        results.append(r)
    sv = cfg.serving
    serving = resolve_profile(sv.backend, sv.profile, sv.endpoint, sv.api_key_env)
    for r in results if evaluate else []:  # `gate --budget` evaluates in rounds itself
        say(f"eval {r.manifest.build_id} ({', '.join(suites)}, {cfg.replicates} replicates) …")
        evaluate_build(workdir, r.manifest.build_id, suites, cfg.replicates, serving, cfg.limit, source=cfg.source,
                       concurrency=sv.concurrency, error_budget=cfg.error_budget, port=sv.port, show_progress=not quiet)
    return results[0].manifest.build_id, [r.manifest.build_id for r in results[1:]]
