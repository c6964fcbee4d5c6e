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


def test_an_endpoint_that_names_no_model_is_refused_unless_declared(bf16_build, tmp_path):
    """#37: answers without `model` and no /v1/models gave answered_models [] and nothing was checked."""
    wd = _workdir(bf16_build, tmp_path)
    bid = bf16_build.manifest.build_id
    args = ("--suites", "toolcall", "--limit", "2", "--replicates", "1")
    with BadServer("anonymous") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, *args)
        assert r.returncode == 3, r.stderr  # was 0
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and "named no model" in lines[0] and f"--served-model {bid}" in lines[0], r.stderr
        store = RunStore(wd / "runs" / bid / "toolcall")
        assert len(store.results(0)) == 2 and store.read_manifest().model_identity() is None  # results kept
        r, _ = _eval(wd, bf16_build, srv.url, *args, "--served-model", bid, "--fresh")
    assert r.returncode == 0, r.stderr
    m = store.read_manifest()
    assert m.serving.served_model == bid and m.model_identity() == ("declared", (bid,))


def _endpoint_runs(tmp_path, declared: dict[str, str | None], urls: dict[str, str]):
    from qverify.models import ServingProfile

    rng = np.random.default_rng(0)
    scores = {"pass@1": synth.bernoulli(np.full(200, 0.7), 3, rng)}
    ids = synth.item_ids("coding", 200)
    for build in declared:
        synth.write_build(tmp_path / "builds", build, recipe=build)
        store = synth.write_run(tmp_path / "runs", build, "coding", synth.results("coding", ids, scores))
        serving = ServingProfile(name="endpoint", backend="endpoint", endpoint=urls[build],
                                 served_model=declared[build])
        store.write_manifest(store.read_manifest().model_copy(update={
            "serving": serving, "served_model": build, "answered_models": []}))


def test_the_gate_refuses_runs_of_an_endpoint_that_named_no_model(tmp_path):
    url = "http://10.0.0.5:30000/v1"
    _endpoint_runs(tmp_path, {"base": "base", "cand": None}, {"base": url, "cand": "http://10.0.0.6:30000/v1"})
    r = run_gate(tmp_path, "base", ["cand"], suites=["coding"], config=QVerifyConfig())
    (cand,) = r.candidates
    assert cand.verdict == "INCONCLUSIVE", cand  # was PASS
    assert any("endpoint named no model" in p and "--served-model cand" in p for p in cand.integrity), cand.integrity


def test_two_builds_answered_by_one_identical_endpoint_do_not_pass(tmp_path):
    url = "http://10.0.0.5:30000/v1"
    _endpoint_runs(tmp_path, {"base": "base", "cand": "cand"}, {"base": url, "cand": url})
    r = run_gate(tmp_path, "base", ["cand"], suites=["coding"], config=QVerifyConfig())
    (cand,) = r.candidates
    assert cand.verdict == "INCONCLUSIVE", cand  # one canned server "serving" both builds gated PASS
    assert any("one identical endpoint" in p for p in cand.integrity), cand.integrity
    # declared names on two different endpoints: nothing says they are one server
    _endpoint_runs(tmp_path / "two", {"base": "base", "cand": "cand"}, {"base": url, "cand": "http://10.0.0.6:1/v1"})
    r = run_gate(tmp_path / "two", "base", ["cand"], suites=["coding"], config=QVerifyConfig())
    assert r.candidates[0].verdict == "PASS" and not r.candidates[0].integrity, r.candidates[0].integrity
