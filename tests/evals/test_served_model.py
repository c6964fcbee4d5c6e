"""The served model is checked (#31): a run records the model name its server answered as, and the gate refuses
a run served as anything but its build. The eval runs the real CLI against a real HTTP server (tests/badserver.py,
which answers as model "m"); the gate reads runs written through the real RunStore."""

from __future__ import annotations

import numpy as np

from qverify.config import QVerifyConfig
from qverify.evals.store import RunStore
from qverify.gate import run_gate
from tests import synth
from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir


def test_the_run_manifest_records_the_model_the_server_answered_as(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    with BadServer("canned") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", "2", "--replicates", "1")
    assert r.returncode == 0, r.stderr
    m = RunStore(wd / "runs" / bf16_build.manifest.build_id / "toolcall").read_manifest()
    assert m.served_model == bf16_build.manifest.build_id  # what was asked for
    assert m.answered_models == ["m"] and m.served_other() == ["m"]  # what answered


def test_the_gate_refuses_runs_served_as_another_model(tmp_path):
    rng = np.random.default_rng(0)
    scores = {"pass@1": synth.bernoulli(np.full(200, 0.7), 3, rng)}
    ids = synth.item_ids("coding", 200)
    for build in ("base", "same", "other"):
        synth.write_build(tmp_path / "builds", build, recipe=build)
        store = synth.write_run(tmp_path / "runs", build, "coding", synth.results("coding", ids, scores))
        m = store.read_manifest()
        answered = ["someone-else"] if build == "other" else [build]
        store.write_manifest(m.model_copy(update={"served_model": build, "answered_models": answered}))
    r = run_gate(tmp_path, "base", ["same", "other"], suites=["coding"], config=QVerifyConfig())
    same, other = r.candidates
    assert same.verdict == "PASS" and not same.integrity, same.integrity
    assert other.verdict == "INCONCLUSIVE" and not other.metrics
    assert any("answered as 'someone-else', not other" in p for p in other.integrity), other.integrity
