"""greedy/match's reference for a pair of builds, decided by content alone (two build manifests).

A pure rule shared by the twin composer (qverify.quantize.twin, pipeline.ensure_twins) and the gate's search
(qverify.gate.reference): it lives below both so that qverify.gate imports no quantize module.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

from qverify.models import BuildManifest


class ReferenceKind(NamedTuple):
    kind: Literal["baseline", "not_gated", "twin", "none"]
    reason: str = ""  # for "not_gated" and "none": why, in a sentence the gate reports


def reference_kind(base: BuildManifest, cand: BuildManifest) -> ReferenceKind:
    """greedy/match's reference for this pair, by content: the one rule that the composer (pipeline.ensure_twins),
    compose_twin and the gate's search (qverify.gate.reference.twin_builds) all follow.

    - "baseline": the candidate's target is the baseline's (a drafter-only change, or an A/A rebuild);
    - "not_gated": the candidate carries the baseline's drafter (a target-only change, or no drafter on either
      side): no drafter change to measure;
    - "twin": both changed: the candidate's target with the baseline's drafter (compose_twin);
    - "none": both changed but no twin can be composed (a side without a drafter, another source model)."""
    if cand.part_hashes("target") == base.part_hashes("target"):
        return ReferenceKind("baseline")
    bd, cd = base.part_hashes("drafter"), cand.part_hashes("drafter")
    if bd == cd:
        return ReferenceKind("not_gated", "the candidate carries the baseline's drafter: greedy/match has no drafter "
                                          "change to measure (its target change shows in the other suites)")
    if not bd or not cd:
        who = base.build_id if not bd else cand.build_id
        return ReferenceKind("none", f"{who} has no drafter, so no build can have the candidate's target with the "
                                     "baseline's drafter, and against the baseline greedy/match would count the target's "
                                     "own changes")
    if base.source_hash != cand.source_hash:
        return ReferenceKind("none", f"{cand.build_id} and {base.build_id} come from different source models")
    return ReferenceKind("twin")
