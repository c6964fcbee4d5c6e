"""Every gate of a candidate against a baseline is a look of one sequence (qverify.gate.ledger, issue 35.2): the
looks live with the runs, so deleting gates/, copying the runs elsewhere or sampling again with another salt
leaves them, and a later gate spends only the alpha left. The first two tests fail on the rule before, which
found earlier gates in gates/ only."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from qverify.config import QVerifyConfig
from qverify.errors import BadInput
from qverify.gate import ledger
from qverify.rounds import gate_builds
from qverify.workdir import Workdir
from tests import synth


def _runs(root, n: int, full: dict, salt: int = 0) -> None:
    for build in ("b", "c"):
        if not (root / "builds" / build).exists():
            synth.write_build(root / "builds", build, recipe=build)
        store = synth.write_run(root / "runs", build, "coding",
                                synth.results("coding", synth.item_ids("coding", n), {"pass@1": full[build][:n]}))
        if salt:
            m = store.read_manifest()
            m.seed_salt = salt
            store.write_manifest(m)


@pytest.fixture
def first_gate(tmp_path):
    rng = np.random.default_rng(0)
    p = rng.beta(0.3, 0.3, 120)
    full = {b: (rng.random((120, 3)) < p[:, None]).astype(float) for b in ("b", "c")}
    _runs(tmp_path, 40, full)
    r, _, _ = gate_builds(Workdir.at(tmp_path), QVerifyConfig(), "b", ["c"], ["coding"], None, show_progress=False)
    assert r.verdict == "INCONCLUSIVE"
    return tmp_path, full


def test_deleting_gates_keeps_the_looks(first_gate):
    root, full = first_gate
    shutil.rmtree(root / "gates")
    _runs(root, 120, full)
    with pytest.raises(BadInput, match="is spent"):
        gate_builds(Workdir.at(root), QVerifyConfig(), "b", ["c"], ["coding"], None, show_progress=False)


def test_copied_runs_and_another_salt_keep_the_looks(first_gate, tmp_path_factory):
    root, full = first_gate
    other = tmp_path_factory.mktemp("copy")
    shutil.copytree(root / "runs", other / "runs")
    shutil.copytree(root / "builds", other / "builds")
    _runs(other, 40, full, salt=7)  # the same items sampled again under another salt: the same experiment
    with pytest.raises(BadInput, match="is spent"):
        gate_builds(Workdir.at(other), QVerifyConfig(), "b", ["c"], ["coding"], None, show_progress=False)


def test_a_later_gate_spends_what_a_stopped_sequence_left(tmp_path):
    """A budgeted sequence that stopped at look 3 of 12 spent f(3/12); a fixed gate after it gets the rest, and one
    more after that gets nothing. Resuming the sequence after the fixed gate looked is refused (it is closed)."""
    ledger.record(tmp_path, "b", ["c"], ["coding"], "seq-x/0", 0.0197, "budgeted", "g1", 3, {"coding": 180})
    assert abs(ledger.remaining(tmp_path, "b", ["c"], ["coding"], "fixed-y", 0.05) - 0.0303) < 1e-12
    assert ledger.remaining(tmp_path, "b", ["c"], ["toolcall"], "fixed-y", 0.05) == 0.05  # another hypothesis
    ledger.record(tmp_path, "b", ["c"], ["coding"], "fixed-y", 0.0303, "fixed", "g2", 1, {"coding": 240})
    with pytest.raises(BadInput, match="is spent"):
        ledger.remaining(tmp_path, "b", ["c"], ["coding"], "fixed-z", 0.05)
    with pytest.raises(BadInput, match="closed"):
        ledger.remaining(tmp_path, "b", ["c"], ["coding"], "seq-x/0", 0.05)
