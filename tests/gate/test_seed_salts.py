"""Runs sampled with different seed salts are gated (not refused), and the report says so."""

from __future__ import annotations

import json

import numpy as np

from qverify.evals.store import RunStore
from qverify.gate import run_gate
from qverify.gate.render import compact_lines
from tests import synth

N, K = 200, 3


def _put(wd, build: str, outcomes: np.ndarray, salt: int) -> None:
    synth.write_build(wd / "builds", build, recipe=build)
    store = synth.write_run(wd / "runs", build, "coding", synth.results("coding", synth.item_ids("coding", N),
                                                                        {"pass@1": outcomes}))
    m = store.read_manifest()
    m.seed_salt = salt
    store.write_manifest(m)


def test_differing_salts_are_gated_and_reported(tmp_path):
    rng = np.random.default_rng(3)
    p = np.where(rng.random(N) < 0.8, 1.0, 0.0)  # stable items: the same outcome under any seed
    same = synth.bernoulli(p, K, rng)
    _put(tmp_path, "base", same, salt=0)
    _put(tmp_path, "coupled", same, salt=0)
    _put(tmp_path, "uncoupled", same, salt=9)
    rep = run_gate(tmp_path, "base", ["coupled", "uncoupled"], ["coding"])
    coupled, uncoupled = rep.candidates
    assert coupled.seed_salts == {"baseline": [0], "candidate": [0]}
    assert uncoupled.seed_salts == {"baseline": [0], "candidate": [9]}
    # the same outcomes: the salt alone never refuses nor changes the verdict (here both PASS)
    assert not uncoupled.integrity and uncoupled.verdict == coupled.verdict == "PASS"
    text = "\n".join(compact_lines(rep))
    assert text.count("seed salts differ") == 1 and "candidate [9]" in text
    # recorded in gate.json, and a different salt is a different gate (the run manifests differ)
    saved = json.loads((tmp_path / "gates" / rep.gate_id / "gate.json").read_text())
    assert saved["candidates"][1]["seed_salts"]["candidate"] == [9]
    m = RunStore(tmp_path / "runs" / "uncoupled" / "coding").read_manifest()
    m.seed_salt = 0
    RunStore(tmp_path / "runs" / "uncoupled" / "coding").write_manifest(m)
    assert run_gate(tmp_path, "base", ["coupled", "uncoupled"], ["coding"]).gate_id != rep.gate_id


def test_old_manifests_without_a_salt_read_as_salt_0(tmp_path):
    _put(tmp_path, "old", np.ones((N, K)), salt=0)
    path = tmp_path / "runs" / "old" / "coding" / "manifest.json"
    raw = json.loads(path.read_text())
    del raw["seed_salt"]
    path.write_text(json.dumps(raw))
    assert RunStore(path.parent).read_manifest().seed_salt == 0


def test_gate_seed_salt_flag_is_checked_at_the_boundary(tmp_path):
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "qverify", "--workdir", str(tmp_path), "gate", "--recipe", "bf16",
                        "--seed-salt", "-2"], check=False, capture_output=True, text=True, timeout=60)
    assert r.returncode == 4 and "--seed-salt must be >= 0" in r.stdout + r.stderr


def test_config_salt_reaches_the_eval_spec_and_flags_override_it():
    from qverify.config import QVerifyConfig
    from qverify.pipeline import EvalSpec

    assert EvalSpec.from_config(QVerifyConfig()).seed_salt == 0
    assert EvalSpec.from_config(QVerifyConfig(seed_salt=5)).seed_salt == 5  # `gate --seed-salt` sets the config's
    assert EvalSpec.from_config(QVerifyConfig(seed_salt=5), seed_salt=2).seed_salt == 2  # `eval --seed-salt`
