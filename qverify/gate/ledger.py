"""Every gate of a candidate against a baseline is a look of one sequence, whatever the route (issue 35.2).

A fixed gate on runs grown after a budgeted one, a fixed gate every 60 items after deleting gates/, runs copied into
a new workdir, a fresh --seed-salt on the same items: each re-tests the same hypothesis on (mostly) the same items,
and at full alpha each raised the false-PASS rate at -tol (0.050 -> 0.080, 0.065 -> 0.095, 0.156 after 12 gates).
So the looks are recorded with the runs, in runs/<candidate>/LEDGER (deleting gates/ or copying runs/ keeps them),
one line per gate and suite: its instance and the alpha it has spent so far. A later gate of the candidate against
the same baseline on the suite spends only what remains, alpha minus the sum of what every other instance spent
on it (a metric's false PASS involves only the looks at its suite) (a union bound: each instance's sequence holds its own level, so the chance of any false PASS over all of them
is at most the sum, whatever their dependence). A budgeted sequence that stopped early spent f(t_j), the spending
function at its last look, and leaves the rest; a fixed gate spends all of its alpha. Re-gating a suite's unchanged
runs (same fingerprints, whatever else the gate covers) is the same instance and spends nothing new: the same data
at the same level give the same verdict. An instance resumed after another gate looked is
closed: it would spend alpha already given to the later one. The salt is no part of an instance's key: another
salt on the same items is the same experiment, so it is accounted like any other gate.

What no tool can see: runs deleted and evaluated again from scratch (or on another machine), keeping the first
PASS, is multiple testing of the same hypothesis (docs/gate.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from qverify.errors import BadInput

LEDGER = "gate-looks.jsonl"
SPENT = 0.999  # a gate starts only while more than 0.1% of alpha is left (below that no verdict can come)


def path(runs_root: Path, candidate: str) -> Path:
    return Path(runs_root) / candidate / LEDGER


Instance = str | Callable[[str, str], str]  # one id, or (candidate, suite) -> id


def _id(instance: Instance, candidate: str, suite: str) -> str:
    return instance if isinstance(instance, str) else instance(candidate, suite)


def entries(runs_root: Path, baseline: str, candidate: str, suite: str) -> list[dict]:
    """This pair's recorded looks at `suite`, in the order they were made."""
    p = path(runs_root, candidate)
    if not p.exists():
        return []
    out = []
    for line in p.read_text().splitlines():
        try:
            e = json.loads(line)
        except ValueError:
            continue
        if e.get("baseline") == baseline and e.get("suite") == suite:
            out.append(e)
    return out


def spent_elsewhere(runs_root: Path, baseline: str, candidate: str, suite: str, instance: str) -> float:
    """Alpha spent on the suite by every other gate of the pair; BadInput when `instance` is resumed after
    another gate looked (it is closed)."""
    es = entries(runs_root, baseline, candidate, suite)
    own = [i for i, e in enumerate(es) if e["instance"] == instance]
    if own and any(e["instance"] != instance for e in es[own[-1] + 1:]):
        later = next(e for e in es[own[-1] + 1:] if e["instance"] != instance)
        raise BadInput(f"{candidate} against {baseline}: this gate's sequence was looked at again by a later gate "
                       f"({later.get('kind')} gate {later.get('gate_id')}); the sequence is closed: resuming it "
                       "would spend alpha given to that one",
                       fix="report the later gate's verdict; the sequence is closed")
    most: dict[str, float] = {}
    for e in es:
        if e["instance"] != instance:
            most[e["instance"]] = max(most.get(e["instance"], 0.0), float(e["spent"]))
    return sum(most.values())


def remaining(runs_root: Path, baseline: str, candidates: list[str], suites: list[str], instance: Instance,
              alpha: float) -> float:
    """The alpha a gate may spend: the least any of its candidates has left on any of its suites (a metric's false
    PASS involves only the looks at its suite). BadInput when none is left: the earlier gates' verdicts stand."""
    left = min((alpha - spent_elsewhere(runs_root, baseline, c, s, _id(instance, c, s))
                for c in candidates for s in suites), default=alpha)
    if left <= alpha * (1 - SPENT):
        raise BadInput(f"the alpha of {', '.join(candidates)} against {baseline} on {', '.join(suites)} is spent: earlier "
                       f"gates looked at these runs (recorded in runs/<candidate>/{LEDGER}); another look at any alpha "
                       "would raise the false-PASS rate (optional stopping)",
                       fix="the earlier gates' verdicts stand; a new decision needs items no gate has seen")
    return left


def record(runs_root: Path, baseline: str, candidates: list[str], suites: list[str], instance: Instance, spent: float,
           kind: str, gate_id: str, looks: int, items: dict[str, int]) -> None:
    """One line per candidate and suite: this gate's instance has spent `spent` alpha on it so far."""
    for c in candidates:
        p = path(runs_root, c)
        p.parent.mkdir(parents=True, exist_ok=True)
        with open(p, "a") as f:
            f.writelines(json.dumps({"baseline": baseline, "candidate": c, "suite": s, "instance": _id(instance, c, s),
                                    "spent": spent, "kind": kind, "gate_id": gate_id, "looks": looks,
                                    "items": items.get(s)}) + "\n" for s in suites)
