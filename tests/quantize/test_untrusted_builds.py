"""A build directory or recipe someone hands us is untrusted (#31): it cannot turn on its own code, write
outside the workdir, or pass for another build. Real builds of the tiny model, the real CLI; nothing mocked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from qverify.errors import BadInput
from qverify.models import BuildManifest
from qverify.quantize import manifest as mf
from qverify.workdir import Workdir

ROOT = Path(__file__).resolve().parents[2]


def qv(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    env = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
    return subprocess.run([sys.executable, "-m", "qverify", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=600, env=env, check=False)


def _hostile_copy(built, tmp_path: Path, **manifest_changes) -> Path:
    """A copy of a real bf16 build, edited as an attacker would, with build.json's hashes made consistent."""
    d = tmp_path / "handed-over"
    shutil.copytree(built("bf16").build_dir, d)
    m = BuildManifest.model_validate_json((d / "build.json").read_text())
    data = m.model_dump() | manifest_changes
    data["tensor_hashes"] = mf.hash_dir(d)
    (d / "build.json").write_text(json.dumps(data))
    return d


def _with_remote_code(d: Path, marker: Path) -> None:
    """A tokenizer reachable only through auto_map, whose module writes `marker` when imported."""
    (d / "tokenization_evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                            "from transformers import PreTrainedTokenizerFast as EvilTokenizer\n")
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["auto_map"] = {"AutoTokenizer": [None, "tokenization_evil.EvilTokenizer"]}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))


def test_build_json_cannot_turn_on_remote_code(built, tmp_path):
    marker = tmp_path / "pwned"
    d = tmp_path / "handed-over"
    shutil.copytree(built("bf16").build_dir, d)
    _with_remote_code(d, marker)
    m = BuildManifest.model_validate_json((d / "build.json").read_text())
    (d / "build.json").write_text(m.model_copy(update={"trust_remote_code": True,
                                                       "tensor_hashes": mf.hash_dir(d)}).model_dump_json())
    env = {"HF_MODULES_CACHE": str(tmp_path / "hf_modules")}
    for argv in (["verify-build", str(d)], ["eval", str(d), "--suites", "greedy", "--limit", "1", "--replicates", "1"]):
        r = qv("--workdir", str(tmp_path / "wd"), *argv, cwd=tmp_path, env=env)
        assert r.returncode == 4 and "--trust-remote-code" in r.stderr, (argv, r.returncode, r.stderr[-2000:])
        assert not marker.exists(), argv  # refused before anything of the build was imported
    # the user's flag is what allows it
    r = qv("--workdir", str(tmp_path / "wd"), "verify-build", str(d), "--trust-remote-code", cwd=tmp_path, env=env)
    assert marker.exists(), r.stderr[-2000:]


def test_backends_refuse_remote_code_without_permission(built, tmp_path):
    from qverify.models import ServingProfile
    from qverify.serve import get_backend

    res = built("bf16")
    m = res.manifest.model_copy(update={"trust_remote_code": True})
    for name, profile in (("local", ServingProfile()), ("sglang", ServingProfile(name="p", backend="sglang"))):
        with pytest.raises(BadInput, match="not allowed here"):
            get_backend(name)(res.build_dir, m, profile, tmp_path / "logs")
    sg = get_backend("sglang")(res.build_dir, m, ServingProfile(name="p", backend="sglang"), tmp_path / "logs",
                               port=30123, trust_remote_code=True)
    assert "--trust-remote-code" in sg.sglang_args()


def test_build_id_that_climbs_is_refused_and_nothing_is_written_outside(built, tmp_path):
    with pytest.raises(ValueError, match="not a safe name"):
        BuildManifest(build_id="../../escape", recipe="r", recipe_hash="h", recipe_text="", source_model="s", source_hash="h")
    d = _hostile_copy(built, tmp_path, build_id="../../escape")
    wd = tmp_path / "a" / "b" / "wd"
    r = qv("--workdir", str(wd), "eval", str(d), "--suites", "greedy", "--limit", "1", "--replicates", "1", cwd=tmp_path)
    assert r.returncode == 4, r.stderr[-2000:]
    assert not (tmp_path / "a" / "escape").exists() and not (wd / "runs").exists()


@pytest.mark.slow
def test_recipe_name_that_climbs_is_refused(tiny_model, tmp_path):
    text = (Path(__file__).resolve().parents[2] / "qverify/quantize/recipes/bf16.yaml").read_text()
    (tmp_path / "r.yaml").write_text(f"name: ../../published\n{text}")
    wd = tmp_path / "a" / "b" / "wd"
    r = qv("--workdir", str(wd), "build", "--recipe", str(tmp_path / "r.yaml"), "--model", str(tiny_model), cwd=tmp_path)
    assert r.returncode == 4 and "not a safe name" in r.stderr, r.stderr[-2000:]
    assert not list((tmp_path / "a").glob("published*"))


def test_workdir_refuses_paths_outside(tmp_path):
    wd = Workdir.at(tmp_path / "wd")
    (tmp_path / "elsewhere").mkdir()
    wd.builds.mkdir(parents=True)
    (wd.builds / "link").symlink_to(tmp_path / "elsewhere")
    for f in (lambda: wd.run_dir("..", ".."), lambda: wd.build_dir("../x"), lambda: wd.run_dir("b", "../../x"),
              lambda: wd.gate_dir("/etc")):
        with pytest.raises(BadInput, match="resolves outside"):
            f()
    assert wd.run_dir("bf16-abc", "coding") == wd.runs / "bf16-abc" / "coding"
    assert wd.build_dir("link") == wd.builds / "link"  # a build the workdir's owner keeps on another disk


def test_every_served_file_is_part_of_the_build_key(tiny_model, tmp_path):
    from qverify.quantize import build

    src = tmp_path / "src"
    shutil.copytree(tiny_model, src)
    wd = tmp_path / "wd"
    first = build("bf16", model=src, workdir=wd)
    ids = {first.manifest.build_id}
    edits = [("config.json", lambda c: c | {"rope_scaling": {"type": "linear", "factor": 2.0}}),
             ("tokenizer_config.json", lambda c: c | {"chat_template": "{{ messages[0]['content'] }}"}),
             ("generation_config.json", lambda c: c | {"temperature": 0.3})]
    for name, edit in edits:
        p = src / name
        p.write_text(json.dumps(edit(json.loads(p.read_text())) if p.exists() else edit({})))
        r = build("bf16", model=src, workdir=wd)
        assert not r.reused and r.manifest.build_id not in ids, name
        ids.add(r.manifest.build_id)
    (src / "README.md").write_text("docs change nothing that is served\n")
    assert build("bf16", model=src, workdir=wd).reused
