"""greedy/match's reference, found by content: a build whose target equals the candidate's and whose drafter
equals the baseline's (tensor hashes of build.json, split at drafter/: BuildManifest.part_hashes).

Speculative decoding verifies every drafted token, so a drafter change must leave greedy outputs as they
are; greedy/match checks that. Against the baseline it also measures any *target* change, which changes
greedy outputs by itself (docs/gate.md, "greedy/match"). So:

* the candidate's target is the baseline's (a drafter-only change, or an A/A rebuild): the baseline is the
  reference, as before;
* the candidate carries the baseline's drafter (a target-only change): greedy/match has no drafter change
  to measure; it is reported, not gated;
* both changed: the reference is the candidate's twin (qverify/quantize/twin.py), any build with that
  content that has usable greedy runs; none: greedy/match is refused (INCONCLUSIVE), never compared with
  the baseline.
"""

from __future__ import annotations

from dataclasses import dataclass

from qverify.gate.integrity import build_problems, pair_problems, run_problems
from qverify.gate.loader import RunData, load
from qverify.greedy_reference import reference_kind
from qverify.workdir import Workdir

SUITE = "greedy"
FIX = ("`qverify gate --recipe NAME` (or `qverify gate ... --budget N`) composes the candidate's target with the "
       "baseline's drafter and evaluates it on greedy")


@dataclass
class MatchReference:
    build_id: str | None = None  # the build greedy/match is compared with (None: refused or not applicable)
    run: RunData | None = None  # its greedy run
    refusal: str | None = None  # greedy/match is refused: INCONCLUSIVE with this reason
    not_applicable: str | None = None  # nothing to measure: reported, not gated


def twin_builds(wd: Workdir, baseline: str, candidate: str) -> tuple[list[str], MatchReference | None]:
    """Builds with the candidate's target and the baseline's drafter (the baseline first when it is one), or a
    decided MatchReference when no search is needed or possible."""
    bm, cm = wd.build_manifest(baseline), wd.build_manifest(candidate)
    if bm is None or cm is None or not bm.tensor_hashes or not cm.tensor_hashes:
        who = baseline if bm is None or not bm.tensor_hashes else candidate
        return [], MatchReference(refusal=f"build {who} has no build.json with tensor hashes: which drafter and target "
                                          "it serves is unknown, so greedy/match has no reference")
    ref = reference_kind(bm, cm)
    if ref.kind == "baseline":
        return [baseline], None
    if ref.kind == "not_gated":
        return [], MatchReference(not_applicable=ref.reason)
    if ref.kind == "none":
        return [], MatchReference(refusal=ref.reason)
    target, drafter = cm.part_hashes("target"), bm.part_hashes("drafter")
    hits = []
    for d in wd.build_dirs():
        if d.name in (baseline, candidate):
            continue
        m = wd.build_manifest(d.name)
        if m is not None and m.source_hash == cm.source_hash and m.part_hashes("target") == target \
                and m.part_hashes("drafter") == drafter:
            hits.append(d.name)
    return hits, None


def match_reference(wd: Workdir, baseline: str, candidate: str, base_run: RunData, cand_run: RunData,
                    error_budget: float) -> MatchReference:
    """The first build with the reference's content whose greedy runs are complete and comparable with the
    candidate's; otherwise a refusal that says what is missing and how to make it."""
    hits, decided = twin_builds(wd, baseline, candidate)
    if decided is not None:
        return decided
    if not hits:
        return MatchReference(refusal="no build has the candidate's target with the baseline's drafter, and against "
                                      f"the baseline greedy/match would count the target's own changes (fix: {FIX})")
    problems = []
    for ref in hits:
        run = base_run if ref == baseline else load(wd.runs, ref, SUITE)
        bad = run_problems(run, error_budget) + build_problems(wd, ref, [run])
        bad += pair_problems(run, cand_run) if not bad else []
        if not bad:
            return MatchReference(build_id=ref, run=run)
        problems += bad
    return MatchReference(refusal=f"the reference build {hits[0]} (the candidate's target with the baseline's drafter) "
                                  f"has no usable greedy runs: {problems[0]}")
