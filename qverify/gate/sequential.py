"""The budgeted gate's look sizes (qverify.gate.budget plans its looks; qverify.gate.boundaries gives their levels).

An asymptotic confidence sequence for unplanned looks (Waudby-Smith et al. 2021, as `evalsig` ships) lived here
once; nothing called it, since a planned budget's group-sequential boundaries are tighter, so it was removed
(issue 30: dead code out).
"""

from __future__ import annotations


def look_sizes(first: int, per_round: int, max_items: int) -> list[int]:
    """Items after each look: first, first + per_round, ... up to max_items (the last look is at max_items)."""
    out = list(range(first, max_items + 1, per_round)) if per_round > 0 else [first]
    if not out or out[-1] != max_items:
        out.append(max_items)
    return out
