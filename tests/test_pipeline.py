"""The pipeline's one spec: qverify.toml's values, flags overriding them, each default defined once (QVerifyConfig)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.slow
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
    # enough work that each run lasts several seconds: run manifests time-stamp to the second, and the faster
    # engine finished 12 requests inside one second (two runs in the same second cannot show an overlap)
    spec = EvalSpec.from_config(suites=["toolcall"], limit=48, replicates=2)
    evaluate_builds(wd, ids, spec, show_progress=False)
    spans = []
    for b in ids:
        m = RunStore(wd.run_dir(b, "toolcall")).read_manifest()
        assert m.finished and m.n_items == 48
        spans.append((datetime.fromisoformat(m.started), datetime.fromisoformat(m.finished)))
    assert max(s for s, _ in spans) < min(f for _, f in spans)  # the two runs overlapped
    alone = Workdir.at(tmp_path / "alone").ensure()
    only = build("bf16", workdir=alone.root).manifest.build_id
    evaluate_build(alone, only, spec=spec, show_progress=False)

    def answers(w, b):
        return sorted((r.item_id, r.response.content, str(r.response.tool_calls))
                      for r in RunStore(w.run_dir(b, "toolcall")).results(0))

    assert answers(wd, ids[0]) == answers(wd, ids[1]) == answers(alone, only)


@pytest.mark.slow
def test_gate_recipe_and_its_rounds_compose_the_twin_and_evaluate_it_on_greedy_alongside(tiny_model_dir, tmp_path):
    """`qverify gate --recipe` for a candidate that changes target and drafter: the gate's one evaluation flow
    (qverify.rounds) composes the twin (its target, the baseline's drafter) and evaluates it on the greedy suite only,
    on the candidate's items, both for a fixed look (`--fixed`) and round by round (`--budget`), where it grows in
    step with the candidate; the gate compares greedy/match with it. Real builds, real embedded servers on a tiny
    random model."""
    from qverify.config import QVerifyConfig
    from qverify.evals.store import RunStore
    from qverify.gate import run_gate
    from qverify.pipeline import ensure_builds
    from qverify.rounds import gate_builds
    from qverify.workdir import Workdir

    wd = Workdir.at(tmp_path / "wd").ensure()
    cfg = QVerifyConfig(model=str(tiny_model_dir), suites=["greedy"], limit=4, replicates=1, calib_samples=8,
                        calib_seq_len=64, report=False)
    base, (cand,) = ensure_builds(wd, cfg, "bf16", ["fp8kv_nvfp4shared_fp8drafter"])
    fixed, _, _ = gate_builds(wd, cfg, base, [cand], ["greedy", "toolcall"], None, show_progress=False,
                              evaluate_fixed=True)
    twins = [d.name for d in wd.build_dirs() if wd.build_manifest(d.name).composed_from]
    assert len(twins) == 1 and wd.build_manifest(twins[0]).composed_from == {"target": cand, "drafter": base}
    assert fixed.candidates[0].compared_with == {"greedy/match": twins[0]}

    def runs(n: int) -> None:
        ms = {b: RunStore(wd.run_dir(b, "greedy")).read_manifest() for b in (base, cand, twins[0])}
        assert all(m is not None and m.complete and m.n_items == n for m in ms.values()), ms
        assert len({m.item_set_hash for m in ms.values()}) == 1

    runs(4)
    assert not wd.run_dir(twins[0], "toolcall").exists()  # the twin serves greedy/match only
    assert run_gate(wd, base, [cand], ["greedy"], cfg, write=False).candidates[0].compared_with == \
        {"greedy/match": twins[0]}
    # two rounds of 4 items x 1 replicate on 3 builds (baseline, candidate, twin): 24 requests. The fixed gate above
    # spent the pair's alpha (qverify.gate.ledger); this test is about the twin, so it starts the ledger afresh
    (wd.runs / cand / "gate-looks.jsonl").unlink()
    report, looks, _ = gate_builds(wd, cfg, base, [cand], ["greedy"], "24", show_progress=False)
    runs(8)
    assert len(looks) == 2 and looks[-1].requests == 24
    assert report.candidates[0].compared_with == {"greedy/match": twins[0]}


@pytest.mark.slow
def test_gate_attaches_to_the_configs_endpoint_as_eval_does(tiny_model_dir, tmp_path):
    """qverify.toml with `[serving] endpoint = URL` and no backend: `qverify eval`, `gate --recipe` and
    `gate --budget` all resolve the profile through pipeline.serving_profile and attach to that endpoint (both
    gates used to exit 4: "--endpoint applies to the endpoint backend, not local"). A real embedded server on
    127.0.0.1 plays the endpoint; real builds of the tiny model."""
    import json

    from qverify.evals.store import RunStore
    from qverify.models import ServingProfile
    from qverify.serve.local import LocalBackend
    from qverify.workdir import Workdir

    wd = Workdir.at(tmp_path / "wd")
    with LocalBackend(tiny_model_dir, None, ServingProfile(), tmp_path / "logs") as ep:
        (tmp_path / "qverify.toml").write_text(
            f'model = "{tiny_model_dir}"\nbaseline = "bf16"\nsuites = ["toolcall"]\nlimit = 4\nreplicates = 1\n'
            f'report = false\n[serving]\nendpoint = "{ep.base_url}"\napi_key_env = "QVERIFY_TEST_ENDPOINT_KEY"\n')

        def qv(*args):  # run in tmp_path (its qverify.toml), importing this checkout's qverify
            # the embedded server takes a per-launch key (issue 31): the endpoint's key, named by api_key_env
            env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1]),
                   "QVERIFY_TEST_ENDPOINT_KEY": ep.api_key}
            return subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(wd.root), *args], cwd=tmp_path,
                                  capture_output=True, text=True, timeout=600, env=env, check=False)

        def served_by_endpoint(build_id: str, n: int) -> bool:
            m = RunStore(wd.run_dir(build_id, "toolcall")).read_manifest()
            return m is not None and m.serving.backend == "endpoint" and m.n_items == n

        r = qv("--json", "gate", "--recipe", "as_shipped", "--fixed")  # one look of the config's limit (4)
        assert r.returncode != 4 and "applies to the endpoint backend" not in r.stderr, r.stderr[-2000:]
        report = json.loads(r.stdout)
        base, cand = report["baseline"], report["candidates"][0]["build_id"]
        assert served_by_endpoint(base, 4) and served_by_endpoint(cand, 4)
        # the fixed gate spent the pair's alpha (qverify.gate.ledger); this test is about the endpoint: start afresh
        (wd.runs / cand / "gate-looks.jsonl").unlink()
        r = qv("gate", "--baseline", base, "--candidate", cand, "--budget", "16")  # two rounds of 4 items on 2 builds
        assert r.returncode != 4 and "applies to the endpoint backend" not in r.stderr, r.stderr[-2000:]
        assert served_by_endpoint(base, 8) and served_by_endpoint(cand, 8)
