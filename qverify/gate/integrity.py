"""Refuse to compare runs that are not comparable, and say exactly why.

A refusal is a sentence naming the build, the suite and the fix. The gate never PASSes
a candidate with a refusal (a FAIL found on the comparable suites still stands).
"""

from __future__ import annotations

from qverify.gate.loader import RunData
from qverify.models import RunManifest
from qverify.workdir import Workdir, read_build_manifest

# RunManifest fields that must agree between baseline and candidate runs of a suite
_SAME = ("suite_version", "item_set_hash", "split", "source", "sampling")


def build_problems(wd: Workdir, build_id: str, runs: list[RunData]) -> list[str]:
    """builds/<id>/build.json must exist and carry the id its runs were filed under and record."""
    path = wd.build_manifest_path(build_id)
    endpoint = any(r.manifest is not None and r.manifest.serving.backend == "endpoint" for r in runs)
    out = []
    if not path.exists():
        if not endpoint:  # an external endpoint (e.g. an official API as baseline) has no build dir
            out.append(f"build {build_id}: no {path} to check its runs against (fix: build it with 'qverify build', "
                       f"or gate the build id that owns these runs)")
    else:
        try:
            bm = read_build_manifest(path.parent)
        except ValueError as e:
            return [f"build {build_id}: {path} is not a valid build manifest ({str(e).splitlines()[0]})"]
        if bm.build_id != build_id:
            out.append(f"build {build_id}: its build.json says build_id {bm.build_id} (fix: the build dir was "
                       f"renamed or copied; rebuild it)")
    for r in runs:
        if r.manifest is not None and r.manifest.model_identity() is None:
            out.append(f"build {build_id}, suite {r.suite}: the endpoint named no model (no `model` in its answers, "
                       f"none at /v1/models), so nothing shows which model answered (fix: serve it under a name, e.g. "
                       f"sglang --served-model-name {build_id}, or declare what it serves: 'qverify eval {build_id} "
                       f"--suites {r.suite} --served-model {build_id} --fresh')")
        elif r.manifest is not None and r.manifest.build_id != build_id:
            out.append(f"build {build_id}, suite {r.suite}: the run manifest says build_id {r.manifest.build_id} "
                       f"(fix: these results belong to another build; re-run 'qverify eval')")
        elif r.manifest is not None and path.exists() and (other := r.manifest.served_other()):
            # a server serving another model (a router's default, a stale deployment) measures that model, not
            # this build; an external endpoint without a build dir has no build id to hold it to
            out.append(f"build {build_id}, suite {r.suite}: the server answered as {', '.join(map(repr, other))}, "
                       f"not {build_id} (fix: serve the build under its id, e.g. sglang --served-model-name "
                       f"{build_id}, then 'qverify eval {build_id} --suites {r.suite} --fresh')")
    return out


def run_problems(run: RunData, error_budget: float) -> list[str]:
    """Missing, unfinished, or over the infrastructure-error budget."""
    who = f"build {run.build_id}, suite {run.suite}"
    fix = f"(fix: qverify eval {run.build_id} --suites {run.suite} resumes it)"
    if not run.exists:
        return [f"{who}: no results {fix}"]
    m = run.manifest
    if m is None:
        return [f"{who}: results without a manifest.json {fix}"]
    out = []
    expected = m.n_items * m.replicates
    ok = run.n_results - run.n_errors
    rate = 1.0 - ok / expected if expected else 1.0
    if rate > error_budget:
        out.append(f"{who}: {rate:.1%} of {expected} results are infrastructure errors or missing, "
                   f"over the budget {error_budget:.1%} {fix}")
    elif not m.complete:
        out.append(f"{who}: the run is not marked complete {fix}")
    return out


def pair_problems(base: RunData, cand: RunData) -> list[str]:
    """Baseline and candidate runs of one suite must share items, suite version, split, source and sampling."""
    if base.manifest is None or cand.manifest is None:
        return []
    out = []
    sb, sc = base.manifest.sandbox, cand.manifest.sandbox
    if sb != sc and (sb == "unsandboxed" or sc == "unsandboxed"):
        # without bwrap, model code also reaches the network and the host: scores are not the same measurement
        out.append(f"suite {base.suite}: model code ran {sb or 'unrecorded'} for the baseline and {sc or 'unrecorded'} "
                   f"for the candidate (fix: re-run the unsandboxed one where bwrap works, with --fresh)")
    if (same := _one_endpoint(base.manifest, cand.manifest)) is not None:
        out.append(f"suite {base.suite}: the baseline and the candidate were answered by one identical endpoint "
                   f"({same}), so nothing shows two builds answered (fix: serve each build under its own model name, "
                   f"e.g. sglang --served-model-name BUILD_ID, and re-run both with --fresh)")
    for f in _SAME:
        a, b = getattr(base.manifest, f), getattr(cand.manifest, f)
        if a != b:
            if f == "sampling":
                bd = b.model_dump()
                diff = {k: (v, bd[k]) for k, v in a.model_dump().items() if bd[k] != v}
                out.append(f"suite {base.suite}: sampling differs between the runs, (baseline, candidate) = {diff} "
                           f"(fix: re-run both with the suite's sampling)")
                continue
            what = {"item_set_hash": "item sets", "suite_version": "suite versions"}.get(f, f)
            out.append(f"suite {base.suite}: {what} differ (baseline {base.build_id}: {a}, candidate "
                       f"{cand.build_id}: {b}) (fix: re-run both with the same suite, --limit and --source)")
    return out


def _one_endpoint(a: RunManifest, b: RunManifest) -> str | None:
    """The shared identity when two runs were answered by one endpoint that says the same about itself: the same
    URL and server info, and the same model names (or names the user declared: a declaration is not the server's
    word, and one canned server "serving" two builds gated PASS). None when anything tells them apart."""
    if a.serving.backend != "endpoint" or b.serving.backend != "endpoint":
        return None
    ia, ib = a.model_identity(), b.model_identity()
    if a.serving.endpoint != b.serving.endpoint or a.server_info != b.server_info or ia is None or ib is None:
        return None
    if ia != ib and not (ia[0] == ib[0] == "declared"):
        return None
    names = ", ".join(sorted({*ia[1], *ib[1]}))
    return f"{a.serving.endpoint}, {ia[0]} model {names}, server info {a.server_info or 'none'}"
