"""The release review's content, computed once and rendered twice (report.md and report.html)."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path

from qverify.models import CandidateReport
from qverify.reports.bundle import GateBundle
from qverify.reports.facts import BuildFacts, build_facts, recipe_changes
from qverify.reports.flips import Flip, flipped
from qverify.reports.formatting import fmt_delta

VERDICT_WORD = {"PASS": "passes", "FAIL": "fails", "INCONCLUSIVE": "is inconclusive"}


@dataclass
class Review:
    bundle: GateBundle
    headline: str
    facts: list[BuildFacts]
    changes: dict[str, list[str]]
    flips: dict[str, list[Flip]]
    flip_counts: dict[str, dict[str, int]]
    commands: list[str]
    plots: dict[str, Path] = field(default_factory=dict)


def _candidate_clause(c: CandidateReport) -> str:
    gated = [m for m in c.metrics if m.gated]
    if c.verdict == "PASS":
        return f"{c.recipe} passes: all {len(gated)} gated metrics are shown within their tolerances"
    bad = [m for m in gated if m.verdict == c.verdict] or gated
    if not bad:
        return f"{c.recipe} {VERDICT_WORD[c.verdict]} ({'; '.join(c.reasons) or 'no gated metric'})"
    worst = min(bad, key=lambda m: (m.delta if m.direction == "higher" else -m.delta))
    what = (f"{worst.metric} Δ {fmt_delta(worst, worst.delta)}, bounds [{fmt_delta(worst, worst.ci_low)}, "
            f"{fmt_delta(worst, worst.ci_high)}], tolerance {fmt_delta(worst, worst.tolerance, signed=False)}")
    more = f" and {len(bad) - 1} more" if len(bad) > 1 else ""
    return f"{c.recipe} {VERDICT_WORD[c.verdict]} on {what}{more}"


def headline(bundle: GateBundle) -> str:
    """The verdict in one sentence, first thing a reviewer reads."""
    g = bundle.gate
    clauses = "; ".join(_candidate_clause(c) for c in g.candidates) or "no candidates"
    return f"{g.verdict}: against the {g.baseline_recipe} baseline, {clauses}."


def reproduce_commands(bundle: GateBundle) -> list[str]:
    """The exact commands that rebuild, re-run and re-gate this review, generated from build.json and the run
    manifests: calibration size and remote-code trust as built, and per run its item count, replicates, seed salt,
    split, source and serving (backend, profile, endpoint and key variable) as evaluated."""
    g = bundle.gate
    root = ["qverify"]
    if bundle.workdir != Path(".qverify").resolve():
        root += ["--workdir", str(bundle.workdir)]
    q = lambda *a: shlex.join(root + [str(x) for x in a])
    cmds = [q(*_build_args(bundle, b)) + f"   # expect build id {b}" for b in bundle.build_ids]
    for b in bundle.build_ids:
        cmds += [q(*args) for args in _eval_args(bundle, b)]
    gate_cmd = g.config.get("command")
    if isinstance(gate_cmd, list):
        gate_cmd = shlex.join(gate_cmd)
    cmds.append(gate_cmd or q("gate", "--baseline", g.baseline, *[x for c in g.candidates for x in ("--candidate", c.build_id)]))
    cmds.append(q("report", "--gate", g.gate_id))
    return cmds


def _build_args(bundle: GateBundle, b: str) -> list[str]:
    m = bundle.builds.get(b)
    args = ["build", "--recipe", bundle.recipe(b)]
    if m is None:
        return args
    if m.source_model and "qverify/assets" not in m.source_model:
        args += ["--model", m.source_model]
    if m.drafter and "qverify/assets" not in m.drafter:
        args += ["--drafter", m.drafter]
    calib = m.calibration or {}
    for flag, key in (("--calib-samples", "samples"), ("--calib-seq-len", "seq_len")):
        if calib.get(key):
            args += [flag, str(calib[key])]
    return args + (["--trust-remote-code"] if m.trust_remote_code else [])


def _eval_args(bundle: GateBundle, b: str) -> list[list[str]]:
    """One `qverify eval` per distinct run setting of the build's runs (runs with no manifest: the suite names only)."""
    runs = [r for (bb, _), r in bundle.runs.items() if bb == b]
    groups: dict[tuple, list[str]] = {}
    for r in runs:
        rm = r.manifest
        key = () if rm is None else (rm.n_items, rm.replicates, rm.seed_salt, rm.split, rm.source, rm.serving.backend,
                                     rm.serving.name, rm.serving.endpoint, rm.serving.api_key_env)
        groups.setdefault(key, []).append(r.suite)
    if not groups:
        return [["eval", b, "--suites", ",".join(bundle.suites)]]
    m = bundle.builds.get(b)
    trust = ["--trust-remote-code"] if m is not None and m.trust_remote_code else []
    out = []
    for key, suites in groups.items():
        args = ["eval", b, "--suites", ",".join(suites)]
        if key:
            n, reps, salt, split, source, backend, profile, endpoint, key_env = key
            args += ["--limit", str(n), "--replicates", str(reps), "--backend", backend]
            args += ["--seed-salt", str(salt)] if salt else []
            args += ["--split", split] if split != "test" else []
            args += ["--source", source] if source != "synthetic" else []
            args += ["--profile", profile] if profile and profile != backend else []
            args += ["--endpoint", endpoint] if endpoint else []
            args += ["--api-key-env", key_env] if key_env and backend == "endpoint" else []
        out.append(args + trust)
    return out


def build_review(bundle: GateBundle, flips_per_candidate: int = 4) -> Review:
    base = bundle.builds.get(bundle.gate.baseline)
    every = {c.build_id: flipped(bundle, c.build_id, limit=10**9) for c in bundle.gate.candidates}
    return Review(
        bundle=bundle,
        headline=headline(bundle),
        facts=build_facts(bundle),
        changes={c.build_id: recipe_changes(base, bundle.builds.get(c.build_id)) for c in bundle.gate.candidates},
        flips={b: fl[:flips_per_candidate] for b, fl in every.items()},
        flip_counts={b: {d: sum(f.direction == d for f in fl) for d in ("regressed", "improved")} for b, fl in every.items()},
        commands=reproduce_commands(bundle),
    )
