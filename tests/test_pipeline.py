"""The pipeline's one spec: qverify.toml's values, flags overriding them, each default defined once (QVerifyConfig)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from qverify.config import QVerifyConfig, ServingConfig
from qverify.pipeline import EvalSpec, serving_profile


def test_spec_defaults_are_the_configs():
    spec, cfg = EvalSpec.from_config(), QVerifyConfig()
    assert (spec.suites, spec.replicates, spec.source, spec.error_budget, spec.limit) == \
        (cfg.suites, cfg.replicates, cfg.source, cfg.error_budget, cfg.limit)
    assert (spec.concurrency, spec.port) == (cfg.serving.concurrency, cfg.serving.port)


def test_file_values_flow_and_set_flags_override_them():
    cfg = QVerifyConfig(replicates=5, limit=7, error_budget=0.1, suites=["kld"], serving=ServingConfig(concurrency=2))
    spec = EvalSpec.from_config(cfg, replicates=None, limit=3, concurrency=None)
    assert (spec.replicates, spec.limit, spec.error_budget, spec.suites, spec.concurrency) == (5, 3, 0.1, ["kld"], 2)
    with pytest.raises(TypeError, match="no field"):
        spec.override(replicate=2)


def test_serving_from_the_file_unless_a_flag_says_otherwise():
    assert serving_profile(ServingConfig()).backend == "local"
    # --endpoint alone still means the endpoint backend when the file does not name one
    assert serving_profile(ServingConfig(), endpoint="http://127.0.0.1:9").backend == "endpoint"
    assert serving_profile(ServingConfig(endpoint="http://127.0.0.1:9", backend="endpoint")).endpoint == "http://127.0.0.1:9"


def test_eval_reads_qverify_toml(tmp_path):
    (tmp_path / "qverify.toml").write_text("replicatez = 2\n")
    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path / "wd"), "eval", "nobuild"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 4 and "unknown key 'replicatez'" in r.stderr


def test_builds_are_evaluated_at_the_same_time_on_the_embedded_backend(tmp_path):
    """Two builds, two one-thread servers at once (a 2-core box used to idle a core): their runs overlap in
    time, both complete, and the same weights give the same answers as one build evaluated alone."""
    from datetime import datetime

    from qverify.evals.store import RunStore
    from qverify.pipeline import EvalSpec, evaluate_build, evaluate_builds
    from qverify.quantize import build
    from qverify.workdir import Workdir

    wd = Workdir.at(tmp_path / "wd").ensure()
    ids = [build(r, workdir=wd.root).manifest.build_id for r in ("bf16", "as_shipped")]
    spec = EvalSpec.from_config(suites=["toolcall"], limit=12, replicates=1)
    evaluate_builds(wd, ids, spec, show_progress=False)
    spans = []
    for b in ids:
        m = RunStore(wd.run_dir(b, "toolcall")).read_manifest()
        assert m.finished and m.n_items == 12
        spans.append((datetime.fromisoformat(m.started), datetime.fromisoformat(m.finished)))
    assert max(s for s, _ in spans) < min(f for _, f in spans)  # the two runs overlapped
    alone = Workdir.at(tmp_path / "alone").ensure()
    only = build("bf16", workdir=alone.root).manifest.build_id
    evaluate_build(alone, only, spec=spec, show_progress=False)

    def answers(w, b):
        return sorted((r.item_id, r.response.content, str(r.response.tool_calls))
                      for r in RunStore(w.run_dir(b, "toolcall")).results(0))

    assert answers(wd, ids[0]) == answers(wd, ids[1]) == answers(alone, only)
