"""`qverify recipes | build | builds | verify-build` through the real CLI: bad input is one line, exit 4."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from qverify.cli import main


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def no_builds(workdir: Path) -> bool:
    b = workdir / "builds"
    return not b.exists() or not any(b.iterdir())


@pytest.fixture
def wd(tmp_path) -> Path:
    return tmp_path / "wd"


@pytest.fixture(scope="module")
def no_drafter_model(tiny_model, tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("nodrafter") / "m"
    shutil.copytree(tiny_model, d, ignore=shutil.ignore_patterns("drafter"))
    return d


def test_recipes_json(capsys):
    code, out, _ = run(capsys, "--json", "recipes")
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and rows["nvfp4_all"]["control"] and rows["fp8kv"]["serving"]["kv_cache_dtype"] == "fp8_e4m3"
    assert rows["fp8drafter"]["stages"] == ["drafter"]


def test_unknown_recipe(capsys, wd, tiny_model):
    code, _, err = run(capsys, "--workdir", str(wd), "--json", "build", "--recipe", "fp8kv_nvfp4", "--model", str(tiny_model))
    assert code == 4 and "did you mean 'fp8kv_nvfp4shared'" in one_error(err) and no_builds(wd)


def test_malformed_yaml(capsys, wd, tiny_model, tmp_path):
    p = tmp_path / "r.yaml"
    p.write_text("description: x\ntarget: {quant_stage: [\n")
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", str(p), "--model", str(tiny_model))
    assert code == 4 and f"{p}:3:1" in one_error(err) and no_builds(wd)


def test_missing_model_dir(capsys, wd, tmp_path):
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", "bf16", "--model", str(tmp_path / "nope"))
    assert code == 4 and "not found" in one_error(err) and no_builds(wd)


def test_not_a_hf_model_dir(capsys, wd, tmp_path):
    d = tmp_path / "junk"
    d.mkdir()
    (d / "weights.bin").write_bytes(b"\0" * 16)
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", "bf16", "--model", str(d))
    assert code == 4 and "not a Hugging Face model dir" in one_error(err) and no_builds(wd)


def test_missing_default_model_says_so(capsys, wd, tmp_path, monkeypatch):
    import qverify.assets

    # Boundary fake: where the embedded model is installed (it may not be trained yet on this machine).
    monkeypatch.setattr(qverify.assets, "default_model_dir", lambda: tmp_path / "qverify-tiny")
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", "bf16")
    assert code == 4 and "embedded model qverify-tiny is not installed" in one_error(err)


def test_target_matching_nothing_names_the_pattern(capsys, wd, tiny_model, tmp_path):
    p = tmp_path / "nomatch.yaml"
    p.write_text("description: x\nserving: {weight_quantization: compressed-tensors}\ntarget:\n  quant_stage:\n"
                 "    quant_modifiers:\n      QuantizationModifier: {targets: ['re:.*no_such_proj$'], scheme: NVFP4}\n")
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", str(p), "--model", str(tiny_model),
                       "--calib-samples", "4", "--calib-seq-len", "32")
    assert code == 4 and "'re:.*no_such_proj$' matches no Linear module" in one_error(err) and no_builds(wd)


def test_drafter_recipe_without_drafter(capsys, wd, no_drafter_model):
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", "fp8drafter", "--model", str(no_drafter_model))
    assert code == 4 and "quantizes the drafter" in one_error(err) and no_builds(wd)


def test_build_list_verify_and_refuse_tampered(capsys, wd, tiny_model):
    code, out, _ = run(capsys, "--workdir", str(wd), "--json", "build", "--recipe", "bf16", "--model", str(tiny_model))
    res = json.loads(out)
    assert code == 0 and not res["reused"] and res["verify"]["ok"]
    code, out, _ = run(capsys, "--workdir", str(wd), "--json", "builds")
    assert code == 0 and [b["build_id"] for b in json.loads(out)] == [res["build_id"]]
    code, out, _ = run(capsys, "--workdir", str(wd), "--json", "verify-build", res["build_id"])
    assert code == 0 and json.loads(out)["ok"]
    cfg = Path(res["build_dir"]) / "generation_config.json"
    cfg.write_text(cfg.read_text().replace("}", ', "temperature": 9.0}', 1))
    code, _, err = run(capsys, "--workdir", str(wd), "verify-build", res["build_dir"])
    assert code == 4 and "generation_config.json::* does not match" in one_error(err)


def _qverify(args, **kw):
    return [sys.executable, "-m", "qverify", *args]


@pytest.mark.slow
def test_disk_full_leaves_nothing(tiny_model, wd):
    """Disk full, emulated with RLIMIT_FSIZE (EFBIG on the first large write; needs no root or tmpfs): exit 3."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    r = subprocess.run(_qverify(["--workdir", str(wd), "build", "--recipe", "bf16", "--model", str(tiny_model)]),
                       check=False, preexec_fn=limit, capture_output=True, text=True, timeout=600)
    assert r.returncode == 3 and "disk full" in one_error(r.stderr)  # infrastructure, as README and errors.py say
    assert no_builds(wd)


@pytest.mark.slow
def test_killed_build_never_looks_valid(tiny_model, wd, capsys):
    from qverify.quantize.build import clean_stale

    env = dict(os.environ, TOKENIZERS_PARALLELISM="false")
    p = subprocess.Popen(_qverify(["--workdir", str(wd), "build", "--recipe", "bf16", "--model", str(tiny_model)]),
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    builds = wd / "builds"
    deadline = time.time() + 300
    while time.time() < deadline and not (builds.exists() and any(".tmp-" in d.name for d in builds.iterdir())):
        if p.poll() is not None:
            pytest.fail("the build finished before it could be killed")
        time.sleep(0.02)
    p.send_signal(signal.SIGKILL)
    p.wait()
    left = list(builds.iterdir())
    assert left and all(d.name.startswith(".") for d in left)  # only the hidden temp dir
    code, out, _ = run(capsys, "--workdir", str(wd), "--json", "builds")
    assert code == 0 and json.loads(out) == []
    stale = left[0]
    clean_stale(builds / stale.name.split(".tmp-")[0].lstrip("."))  # what the next build of that id does first
    assert not stale.exists()


def _dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


def test_stale_dirs_of_dead_builds_go_and_a_running_builds_stay(wd):
    """What a killed build leaves (temp dir with build.json, the streamed path's scratch dir, a replaced build being
    swapped out) is never a build the gate takes, and the next build of that id removes it; a running build's dirs
    (this process stands in for one) are kept. Old code removed the live scratch dir and kept the dead `.old-`."""
    from qverify.errors import BadInput
    from qverify.quantize.build import clean_stale
    from qverify.workdir import Workdir

    w = Workdir.at(wd)
    out = w.build_dir("fp8kv_nvfp4shared-0123456789ab")
    names = {pid: [f".{out.name}.tmp-{pid}", f".{out.name}.tmp-{pid}.scratch", f".{out.name}.old-{pid}"]
             for pid in (os.getpid(), _dead_pid())}
    for name in [n for group in names.values() for n in group]:
        (out.parent / name).mkdir(parents=True)
        (out.parent / name / "build.json").write_text("{}")
    assert w.build_dirs() == []
    with pytest.raises(BadInput, match="no build"):
        w.resolve_build("fp8kv_nvfp4shared")
    clean_stale(out)
    assert sorted(p.name for p in out.parent.iterdir()) == sorted(names[os.getpid()])


def test_build_progress_reaches_a_log(capsys, wd, kimi_k25):
    """In a log (stderr not a terminal) each progress step is a line: stage, shard i of n, bytes. A spinner there
    showed nothing until a stage ended (old code: no 'copy: shard' line)."""
    code, _, err = run(capsys, "--workdir", str(wd), "build", "--recipe", "as_shipped", "--model", str(kimi_k25),
                       "--trust-remote-code")
    assert code == 0, err
    shards = len(list(kimi_k25.glob("*.safetensors")))
    assert f"copy: shard {shards} of {shards} (" in err and " GB)" in err
    assert err.index("resolve …") < err.index("copy: shard 1 of") < err.index("✓ verify")
