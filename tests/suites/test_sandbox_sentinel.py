"""A coding pass means the checks ran to their end (issue #37): answers that exit early, fake the sentinel, or
return an always-equal object fail. Real bwrap sandbox, real HumanEval items; end to end through `qverify eval`
against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from qverify.evals.store import RunStore
from qverify.suites.coding import run_answer
from qverify.suites.humaneval_source import humaneval_items
from qverify.suites.sandbox import run_tests, sandbox_kind
from tests.badserver import BadServer

pytestmark = pytest.mark.skipif(sandbox_kind() != "bwrap", reason="needs bubblewrap: apt-get install -y bubblewrap")

TRUNCATE = "def truncate_number(number: float) -> float:\n"  # HumanEval/2; the right body is `return number % 1.0`


def _he(task: int):
    return humaneval_items(task + 1)[task].target


EARLY_EXITS = {
    "sys.exit": "import sys\nsys.exit(0)\n",
    "os._exit": "import os\nos._exit(0)\n",
    "atexit": "import atexit, os\natexit.register(lambda: os._exit(0))\nraise SystemExit\n",
    "exit inside the call": TRUNCATE + "    import os\n    os._exit(0)\n",
    "SystemExit inside the call": TRUNCATE + "    raise SystemExit(0)\n",
}


@pytest.mark.parametrize("name", list(EARLY_EXITS))
def test_an_answer_that_exits_before_its_checks_fails(name):
    r = run_answer(_he(2), EARLY_EXITS[name])
    assert r.returncode == 0 and not r.passed, (name, r)  # exit status 0: the old rule called this a pass
    assert r.reason == "exited before its checks finished"
    assert run_answer(_he(2), TRUNCATE + "    return number % 1.0\n").passed  # the right answer still passes


# An answer that knows the protocol and hunts for the nonce, or for the frame that holds it.
FORGERS = {
    "reads stdin": "import sys, os\nos.write(1, b'\\n' + sys.stdin.buffer.read() + b'\\n')\nos._exit(0)\n",
    "walks the stack": ("import sys, os\nf = sys._getframe()\nwhile f.f_back: f = f.f_back\n"
                        "os.write(1, repr(f.f_locals).encode())\nos._exit(0)\n"),
    "walks a traceback": ("import os\ntry:\n    1/0\nexcept Exception as e:\n    f = e.__traceback__.tb_frame\n"
                          "    os.write(1, repr(f.f_back.f_locals).encode())\nos._exit(0)\n"),
    "signal handler": ("import signal, os\nsignal.signal(signal.SIGALRM, lambda s, f: os._exit(0))\n"
                       "signal.setitimer(signal.ITIMER_REAL, 0.01)\nwhile True: pass\n"),
    "fresh _signal": ("import _imp, importlib.machinery as m\n"
                      "mod = _imp.create_builtin(m.ModuleSpec('_signal', m.BuiltinImporter))\n"
                      "mod.signal(14, lambda s, f: None)\n"),
    "gc": "import gc\nprint(len(gc.get_objects()))\n",
    "ctypes": "import ctypes\n",
    "_ctypes under another package": ("import importlib.util as u\nspec = u.spec_from_file_location('pkg._ctypes', "
                                      "'/usr/lib/python3.11/lib-dynload/_ctypes.cpython-311-x86_64-linux-gnu.so')\n"
                                      "u.module_from_spec(spec)\n"),
    "a subinterpreter": "import _xxsubinterpreters\n",
    "CPython's test API": "import _testcapi\n",
    "a trace hook": "import sys\nsys.settrace(lambda *a: None)\n",
    "unmarshal bytecode": "import marshal\nmarshal.loads(marshal.dumps(compile('1', 'x', 'eval')))\n",
    "build a code object": "(lambda: 0).__code__.replace(co_consts=(1,))\n",
    "a generator's frame": "def g():\n    yield 1\nprint(g().gi_frame)\n",
}


@pytest.mark.parametrize("name", list(FORGERS))
def test_an_answer_cannot_reach_the_nonce(name):
    r = run_tests(FORGERS[name] + "\nassert False\n", timeout_s=5)
    assert not r.passed, (name, r)
    refused = "exited before its checks finished" if name == "reads stdin" else "is not allowed in the coding sandbox"
    assert refused in r.reason, (name, r.reason)  # refused for the right reason, not by some other error


def test_a_native_module_written_by_the_answer_is_not_loaded():
    prog = ("import importlib.util, shutil\n"
            "shutil.copy('/usr/lib/python3.11/lib-dynload/_bz2.cpython-311-x86_64-linux-gnu.so', '/tmp/_bz2.so')\n"
            "spec = importlib.util.spec_from_file_location('_bz2', '/tmp/_bz2.so')\n"
            "importlib.util.module_from_spec(spec)\n")
    r = run_tests(prog)
    assert not r.passed and "loading /tmp/_bz2.so is not allowed" in r.reason


def test_an_always_equal_object_fails():
    always = ("class Anything(float):\n    def __eq__(self, other):\n        return True\n"
              "    def __sub__(self, other):\n        return 0.0\n\n" + TRUNCATE + "    return Anything()\n")
    r = run_answer(_he(2), always)
    assert not r.passed and "not plain builtin data" in r.reason, r
    histogram = humaneval_items(112)[111].target  # HumanEval/111 expects a dict; a Counter is still a right answer
    counter = ("from collections import Counter\n\ndef histogram(test):\n    c = Counter(test.split())\n"
               "    top = max(c.values(), default=0)\n    return Counter({k: v for k, v in c.items() if v == top})\n")
    assert run_answer(histogram, counter).passed


def test_the_checks_use_the_real_builtins_and_the_prompts_helpers():
    patched_abs = "import builtins\nbuiltins.abs = lambda x: 0\n\n" + TRUNCATE + "    return number\n"
    r = run_answer(_he(2), patched_abs)
    assert not r.passed and r.reason == "AssertionError", r
    # HumanEval/32 checks find_zero through the prompt's `poly`: an answer redefining poly to 0 fakes every root
    fake_poly = "def poly(xs, x):\n    return 0\n\ndef find_zero(xs):\n    return 0.0\n"
    r = run_answer(_he(32), fake_poly)
    assert not r.passed and r.reason == "AssertionError", r
    patched_fabs = "import math\nmath.fabs = lambda x: 0.0\n\ndef find_zero(xs):\n    return 0.0\n"
    r = run_answer(_he(32), patched_fabs)
    assert not r.passed and r.reason == "AssertionError", r  # the checks' math.fabs is math's own again


def test_an_eval_of_answers_that_exit_scores_zero(bf16_build, tmp_path):
    wd = tmp_path / "wd"
    (wd / "builds").mkdir(parents=True)
    os.symlink(bf16_build.build_dir, wd / "builds" / bf16_build.manifest.build_id)
    with BadServer("canned", content="```python\nimport sys; sys.exit(0)\n```") as srv:
        cmd = [sys.executable, "-m", "qverify", "--workdir", str(wd), "eval", bf16_build.manifest.build_id,
               "--backend", "endpoint", "--endpoint", srv.url, "--suites", "coding", "--limit", "6",
               "--replicates", "1"]
        r = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    assert "Traceback" not in r.stderr, r.stderr
    rows = RunStore(wd / "runs" / bf16_build.manifest.build_id / "coding").results(0)
    assert len(rows) == 6 and all(not x.error for x in rows), r.stderr
    assert [x.scores["pass@1"] for x in rows] == [0.0] * 6  # was 1.0 each: exit status 0 was a pass
    assert {x.reason for x in rows} == {"exited before its checks finished"}


FORK_AND_ALLOCATE = """
import os
CHUNK = 32 << 20
readers = []
for _ in range(5):
    r, w = os.pipe()
    if os.fork() == 0:  # each child holds as much as it can get, in touched 32 MB chunks, up to 512 MB
        held, n = [], 0
        try:
            while n < (512 << 20):
                held.append(bytearray(CHUNK)); n += CHUNK
        except MemoryError:
            pass
        os.write(w, str(n).encode()); os.close(w)
        os.read(os.open('/dev/null', os.O_RDONLY), 1)  # hold the memory until the parent has read every count
        import time; time.sleep(5); os._exit(0)
    os.close(w); readers.append(r)
print(sum(int(os.read(r, 32) or 0) for r in readers))
"""


def test_memory_is_bounded_per_answer_not_per_process():
    from qverify.suites.sandbox_memory import ANSWER_BYTES, memory_bound

    r = run_tests(FORK_AND_ALLOCATE, timeout_s=60)
    assert r.passed, r
    held = int(r.stdout.split()[-1])
    # was 5 x 512 MB = 2.5 GB (1 GiB of address space per process, 64 processes); the children alone now share
    # the answer's bound
    assert 0 < held <= ANSWER_BYTES, (held, memory_bound())
