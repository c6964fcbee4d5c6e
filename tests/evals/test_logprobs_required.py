"""A suite that asks for logprobs (kld) never computes its metric on the silent subset of responses that
carry them: a response without them is the item's error, counted against the run's error budget (#31)."""

from __future__ import annotations

from qverify.evals.store import RunStore
from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir


def test_responses_without_the_logprobs_asked_for_count_against_the_error_budget(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    with BadServer("canned") as srv:  # answers every request, never with logprobs
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "kld", "--limit", "3", "--replicates", "1")
    assert r.returncode == 3, r.stderr  # incomplete: the gate refuses it instead of gating KL on nothing
    store = RunStore(wd / "runs" / bf16_build.manifest.build_id / "kld")
    rows = store.results(0)
    assert len(rows) == 3 and {x.error for x in rows} == {"no_logprobs"}, rows
    assert all("asked for logprobs" in x.metadata["error_detail"] for x in rows)
    m = store.read_manifest()
    assert m.error_rate == 1.0 and not m.complete
