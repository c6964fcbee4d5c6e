"""The lm-eval adapter end to end: a custom YAML task over a JSONL file shipped here, run by
the real lm_eval.simple_evaluate against a real HTTP server on 127.0.0.1 (conftest)."""

from __future__ import annotations

from pathlib import Path

import pytest

from qverify.errors import BadInput, InfraError
from qverify.models import Endpoint
from qverify.suites import get_suite
from qverify.suites.lmeval import LmEvalSuite

TASK_DIR = Path(__file__).parent / "lmeval_task"
TASK = "qverify_tiny_qa"
# gold answers in qa_tiny.jsonl vs the stub's lookup table: 5 of 7 right
EXPECTED_RIGHT = {"Paris", "4", "cold", "Jupiter", "Python"}


@pytest.fixture(autouse=True)
def _in_task_dir(monkeypatch):
    # lm-eval's `dataset_path: json` resolves data_files against the working directory
    monkeypatch.chdir(TASK_DIR)


def _suite(**kw) -> LmEvalSuite:
    suite = get_suite(f"lmeval:{TASK}", include_path=str(TASK_DIR), **kw)
    assert isinstance(suite, LmEvalSuite)
    return suite


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_runs_task_end_to_end(stub_openai, api):
    suite = _suite(api=api)
    n_before = len(stub_openai.requests)
    results = suite.run(Endpoint(base_url=stub_openai.base_url, model="stub"), replicate=1, seed=7)

    assert len(results) == 7
    assert len(stub_openai.requests) - n_before == 7
    sent = stub_openai.requests[-1]
    assert sent["path"].endswith("/chat/completions" if api == "chat" else "/v1/completions")
    assert sent["body"]["seed"] == 7 and sent["body"]["model"] == "stub"
    assert suite.primary_metric == "exact_match"
    right = {r.metadata["target"] for r in results if r.scores["exact_match"] == 1.0}
    assert right == EXPECTED_RIGHT
    for r in results:
        assert r.suite == f"lmeval:{TASK}" and r.replicate == 1 and r.seed == 7
        assert r.response is not None and r.response.content is not None
        assert (r.reason is None) == (r.scores["exact_match"] == 1.0)
    wrong = next(r for r in results if r.metadata["target"] == "blue")
    assert "green" in wrong.reason and "blue" in wrong.reason


def test_ids_stable_and_match_items(stub_openai):
    suite = _suite()
    endpoint = Endpoint(base_url=stub_openai.base_url, model="stub")
    a = suite.run(endpoint, replicate=0, seed=0)
    b = _suite(api="completions").run(endpoint, replicate=1, seed=1, limit=3)
    ids = [r.item_id for r in a]
    assert len(set(ids)) == 7
    assert {r.item_id for r in b} <= set(ids)  # the same documents pair across runs, apis and limits
    items = suite.items()
    assert sorted(i.id for i in items) == sorted(ids)
    assert all("Question:" in i.prompt for i in items)
    assert suite.items("train") == []


def test_http_error_aborts_with_infra_error(stub_openai):
    stub_openai.fail_status = 400
    try:
        with pytest.raises(InfraError, match="failed: HTTPError: 400"):
            _suite(max_retries=1).run(Endpoint(base_url=stub_openai.base_url, model="stub"))
    finally:
        stub_openai.fail_status = None


def test_unknown_task_is_bad_input():
    with pytest.raises(BadInput, match="did you mean 'qverify_tiny_qa'"):
        get_suite("lmeval:qverify_tiny_q", include_path=str(TASK_DIR)).items()


@pytest.mark.slow
def test_qverify_eval_runs_an_lmeval_task_end_to_end(stub_openai, tmp_path):
    """`qverify eval BUILD --suites lmeval:<task>` through the CLI: the runner hands the suite to lm-eval
    (runs_itself), files it as runs/<build>/lmeval:<task> with lm-eval's per-sample scores, summarises the
    task's metric, and a rerun is a no-op. The build is a manifest only: an endpoint needs no weights."""
    import json
    import os
    import subprocess
    import sys

    from qverify.evals.store import RunStore
    from tests import synth

    wd = tmp_path / "wd"
    synth.write_build(wd / "builds", "b0", recipe="b0")
    cfg = tmp_path / "qverify.toml"
    cfg.write_text(f'[suite_options."lmeval:{TASK}"]\ninclude_path = "{TASK_DIR}"\n')
    args = [sys.executable, "-m", "qverify", "--workdir", str(wd), "--json", "eval", "b0", "--config", str(cfg),
            "--suites", f"lmeval:{TASK}", "--source", "lm-eval", "--replicates", "2",
            "--backend", "endpoint", "--endpoint", stub_openai.base_url]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}  # this checkout's qverify
    for attempt in range(2):
        n_before = len(stub_openai.requests)
        r = subprocess.run(args, capture_output=True, text=True, timeout=600, cwd=TASK_DIR, env=env, check=False)
        assert r.returncode == 0, r.stderr[-3000:]
        (summary,) = json.loads(r.stdout)
        assert summary["suite"] == f"lmeval:{TASK}" and summary["metric"] == "exact_match" and summary["complete"]
        assert summary["mean"] == pytest.approx(5 / 7)  # the stub knows 5 of the 7 answers
        assert len(stub_openai.requests) - n_before == (14 if attempt == 0 else 0)  # 7 documents x 2; then a no-op
    store = RunStore(wd / "runs" / "b0" / f"lmeval:{TASK}")
    m = store.read_manifest()
    assert m.complete and m.n_items == 7 and m.replicates == 2 and m.source == "lm-eval"
    for rep in (0, 1):
        res = store.results(rep)
        assert len(res) == 7 and all(x.scores and x.suite == f"lmeval:{TASK}" for x in res)
