"""Item-level comparisons (qverify.gate.pairwise) that other gate modules build on."""

from __future__ import annotations

import math

import numpy as np
import pytest

from qverify.gate import design as dz
from qverify.gate import pairwise as pw


def test_f1_has_one_definition_and_no_tool_call_on_either_side_is_undefined():
    """F1 without a tool call in either run is undefined (NaN) everywhere: pairwise said 1.0 where design said
    NaN, so the K2VV floor and the gate disagreed on the same runs."""
    never = np.zeros(20)
    assert math.isnan(pw.trigger_f1(never, never))
    assert math.isnan(dz.f1_with_jackknife(never, never)[0])
    assert pw.f1_floor(np.zeros((20, 3)), 0.03) is None  # no floor can be drawn from undefined F1s
    some = np.r_[np.ones(5), np.zeros(15)]
    other = np.r_[np.ones(3), np.zeros(17)]
    # the same value from both modules where it is defined: 2*3 / (2*3 + 0 + 2)
    assert pw.trigger_f1(some, other) == dz.f1_with_jackknife(some, other)[0] == pytest.approx(0.75)
    assert pw.f1_floor(np.column_stack([some, other]), 0.03) == pytest.approx(0.72)
