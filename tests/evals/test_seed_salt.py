"""The seed salt, through the real embedded server: a salt is an independent session, salt 0 is the
historical seeds, one run never mixes two salts, and the salt is recorded where the gate can see it."""

from __future__ import annotations

import hashlib
import subprocess
import sys

import pytest

from qverify.errors import BadInput
from qverify.evals.runner import replicate_seed
from qverify.evals.store import RunStore
from qverify.pipeline import evaluate_build
from qverify.workdir import Workdir

LIMIT, REPS = 6, 2


def _historical_seed(item_id: str, r: int) -> int:
    """The seed formula from before the salt existed, written out here so a change to the default shows."""
    return int(hashlib.sha256(f"{item_id}:{r}".encode()).hexdigest()[:8], 16)


def _answers(store: RunStore) -> dict[tuple[str, int], tuple[int, str]]:
    return {(r.item_id, k): (r.seed, r.response.content + repr(r.response.tool_calls))
            for k in store.replicates() for r in store.results(k) if r.error is None}


def _eval(wd: Workdir, build_dir, **kw):
    return evaluate_build(wd, build_dir, ["toolcall"], show_progress=False, **({"replicates": REPS, "limit": LIMIT} | kw))


def test_salt_reseeds_a_session_and_one_run_keeps_one_salt(bf16_build, tmp_path):
    wd = Workdir.at(tmp_path / "wd")
    build_dir, bid = bf16_build.build_dir, bf16_build.manifest.build_id
    store = RunStore(wd.runs / bid / "toolcall")

    _eval(wd, build_dir)  # no salt: exactly the seeds runs made before the salt existed
    plain = _answers(store)
    assert len(plain) == LIMIT * REPS
    assert all(seed == _historical_seed(i, k) for (i, k), (seed, _) in plain.items())
    assert store.read_manifest().seed_salt == 0

    # resuming or growing the stored run under another salt would mix two sessions in one run
    for kw in ({}, {"grow": True, "limit": LIMIT + 2}):
        with pytest.raises(BadInput, match="seed salt 0, not 7") as e:
            _eval(wd, build_dir, **({"seed_salt": 7} | kw))
        assert "--seed-salt 0" in e.value.fix
    assert _answers(store) == plain  # the refusal wrote nothing

    _eval(wd, build_dir, seed_salt=7, fresh=True)  # the old run is moved aside, a salted one starts
    salted = _answers(store)
    assert store.read_manifest().seed_salt == 7 and store.read_manifest().complete
    assert all(seed == replicate_seed(i, k, 7) != plain[(i, k)][0] for (i, k), (seed, _) in salted.items())
    # toolcall samples at T=0.6: other seeds give other answers (the server is deterministic per seed, below)
    assert sum(salted[key][1] != plain[key][1] for key in plain) >= 2

    again = Workdir.at(tmp_path / "again")  # the same salt in another session reproduces the answers
    _eval(again, build_dir, seed_salt=7)
    assert _answers(RunStore(again.runs / bid / "toolcall")) == salted


def test_cli_seed_salt_is_checked_and_a_mismatch_exits_4_with_the_fix(bf16_build, tmp_path):
    wd = Workdir.at(tmp_path / "wd")
    _eval(wd, bf16_build.build_dir, seed_salt=3)
    base = [sys.executable, "-m", "qverify", "--workdir", str(wd.root), "eval", str(bf16_build.build_dir),
            "--suites", "toolcall", "--replicates", str(REPS), "--limit", str(LIMIT)]
    bad = subprocess.run([*base, "--seed-salt", "-1"], check=False, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 4 and "--seed-salt must be >= 0" in bad.stderr + bad.stdout
    other = subprocess.run([*base, "--seed-salt", "5"], check=False, capture_output=True, text=True, timeout=60)
    assert other.returncode == 4 and "--seed-salt 3" in other.stderr + other.stdout
    same = subprocess.run([*base, "--seed-salt", "3"], check=False, capture_output=True, text=True, timeout=120)
    assert same.returncode == 0, same.stderr  # complete under its own salt: a no-op
