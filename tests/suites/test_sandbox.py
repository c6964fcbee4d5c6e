"""The coding sandbox contains hostile programs and leaves the host unchanged, and runs
every HumanEval canonical solution. Real bwrap, prlimit and setpriv; nothing faked."""

from __future__ import annotations

import os
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from qverify.models import Response
from qverify.suites.coding import CodingSuite, build_program, run_answer
from qverify.suites.humaneval_source import _problems, humaneval_items
from qverify.suites.sandbox import UID_BASE, run_tests, sandbox_kind

pytestmark = pytest.mark.skipif(sandbox_kind() != "bwrap", reason="needs bubblewrap: apt-get install -y bubblewrap")


def _sandbox_processes(wait_s: float = 15.0) -> list[int]:
    """Host processes owned by a sandbox uid once the kernel has finished tearing down the
    sandbox's pid namespace (asynchronous: it SIGKILLs the rest when the namespace's init
    exits); leftovers after `wait_s` would mean the sandbox leaked."""
    deadline = time.monotonic() + wait_s
    while True:
        pids = []
        for pid in os.listdir("/proc"):
            if pid.isdigit():
                try:
                    if os.stat(f"/proc/{pid}").st_uid >= UID_BASE:
                        pids.append(int(pid))
                except OSError:
                    pass
        if not pids or time.monotonic() > deadline:
            return pids
        time.sleep(0.2)


def test_passing_and_failing_programs():
    ok = run_tests("def f(x):\n    return x + 1\n\nassert f(1) == 2\nprint('done')")
    assert ok.passed and ok.returncode == 0 and ok.stdout == "done\n" and ok.reason is None and ok.sandbox == "bwrap"
    bad = run_tests("def f(x):\n    return x\n\nassert f(1) == 2")
    assert not bad.passed and bad.reason == "AssertionError"
    assert not run_tests("def f(:\n").passed  # syntax error


def test_network_is_unreachable(tmp_path):
    # a host listener on 127.0.0.1 must see no connection: the sandbox has its own loopback
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    accepted: list = []

    def accept() -> None:
        try:
            accepted.append(listener.accept())
        except OSError:
            pass

    t = threading.Thread(target=accept)
    t.start()
    prog = (
        f"import socket\nfor host in ('127.0.0.1', '1.1.1.1', '8.8.8.8'):\n    try:\n"
        f"        socket.create_connection((host, {port}), timeout=2)\n        print('CONNECTED', host)\n"
        f"    except OSError as e:\n        print('blocked', host, e)\n"
    )
    r = run_tests(prog)
    t.join()
    listener.close()
    assert r.passed, r.stderr
    assert "CONNECTED" not in r.stdout and r.stdout.count("blocked") == 3
    assert accepted == []


def test_writes_stay_inside(tmp_path):
    target = tmp_path / "escaped.txt"
    prog = (
        f"import os\nfor p in ({str(target)!r}, '/usr/escaped.txt', '/escaped.txt'):\n    try:\n"
        f"        os.makedirs(os.path.dirname(p), exist_ok=True)\n        open(p, 'w').write('x')\n"
        f"        print('wrote', p)\n    except OSError as e:\n        print('denied', p, type(e).__name__)\n"
    )
    r = run_tests(prog)
    assert r.passed, r.stderr
    assert "denied /usr/escaped.txt" in r.stdout and "denied /escaped.txt" in r.stdout
    # the tmp_path write may "succeed" inside the sandbox's own tmpfs /tmp, never on the host
    assert not target.exists() and not os.path.exists("/usr/escaped.txt") and not os.path.exists("/escaped.txt")


def test_host_files_are_invisible(tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("s3cret")
    prog = (
        f"import os\nprint(sorted(os.listdir('/')))\nfor p in ('/root', {str(secret)!r}, '/etc/passwd'):\n"
        f"    try:\n        print(open(p).read() if os.path.isfile(p) else os.listdir(p))\n"
        f"    except OSError as e:\n        print('hidden', type(e).__name__)\n"
    )
    r = run_tests(prog)
    assert r.passed, r.stderr
    assert "s3cret" not in r.stdout and "root:" not in r.stdout
    assert r.stdout.count("hidden") == 3
    assert "root" not in r.stdout.splitlines()[0] and "work" not in r.stdout.splitlines()[0]


def test_fork_bomb_is_contained():
    r = run_tests("import os\nwhile True:\n    os.fork()", timeout_s=20)
    assert not r.passed
    assert _sandbox_processes() == []  # nothing left running on the host


def test_memory_bomb_is_contained():
    r = run_tests("x = []\nwhile True:\n    x.append(' ' * 10**7)", timeout_s=30)
    assert not r.passed
    assert "MemoryError" in r.reason or r.returncode < 0


def test_infinite_loop_times_out():
    r = run_tests("while True:\n    pass", timeout_s=2)
    assert not r.passed and r.timed_out and r.reason == "timed out after 2s"
    assert _sandbox_processes() == []


def test_endless_output_is_capped():
    r = run_tests("while True:\n    print('x' * 1000)", timeout_s=20)
    assert not r.passed and "File too large" in r.reason
    assert len(r.stdout) <= 4000


def test_weak_fallback_records_itself():
    # the weak fallback still applies rlimits, but says it is weak
    ok = run_tests("print(1)", mode="weak")
    assert ok.passed and ok.sandbox == "weak"
    loop = run_tests("while True:\n    pass", timeout_s=2, mode="weak")
    assert not loop.passed and loop.timed_out


def test_all_humaneval_canonical_solutions_pass():
    items = humaneval_items()
    solutions = {p["task_id"]: p["canonical_solution"] for p in _problems()}
    assert len(items) == 164

    def run(item):
        body = solutions[item.metadata["task_id"]]
        return item.metadata["task_id"], run_answer(item.target, body)

    with ThreadPoolExecutor(2) as pool:
        results = dict(pool.map(run, items))
    failed = {k: r.reason for k, r in results.items() if not r.passed}
    assert failed == {}
    assert {r.sandbox for r in results.values()} == {"bwrap"}


def test_humaneval_scoring_full_function_body_and_wrong():
    item = humaneval_items(3)[2]  # HumanEval/2 truncate_number: `return number % 1.0`
    suite = CodingSuite()
    full = f"```python\n{item.target['prompt']}    return number % 1.0\n```"
    body = "    return number % 1.0\n"
    unindented_body = "return number % 1.0"
    for text in (full, body, unindented_body):
        s = suite.score(item, Response(content=text))
        assert s.values["pass@1"] == 1.0, (text, s.reason)
        assert s.values["sandboxed"] == 1.0
    wrong = suite.score(
        item, Response(content="```python\ndef truncate_number(number: float) -> float:\n    return number\n```")
    )
    assert wrong.values["pass@1"] == 0.0 and wrong.reason == "AssertionError"


def test_weak_fallback_cleans_up_a_fork_bomb():
    r = run_tests("import os\nwhile True:\n    os.fork()", timeout_s=10, mode="weak")
    assert not r.passed and r.sandbox == "weak"
    assert _sandbox_processes() == []


def test_dev_and_dev_shm_are_no_ram_sink():
    # /dev/shm and /dev were bwrap's unsized tmpfs: 3 GB of RAM in 4.7 s. Each write below is under
    # RLIMIT_FSIZE (16 MB), so only the mounts' own size can stop them.
    prog = (
        "import os\n"
        "chunk = b'x' * (1 << 20)\n"
        "def fill(d):\n"
        "    n = 0\n"
        "    try:\n"
        "        for i in range(64):\n"
        "            with open(os.path.join(d, f'f{i}'), 'wb') as f:\n"
        "                for _ in range(8):\n"
        "                    f.write(chunk); f.flush(); n += len(chunk)\n"
        "    except OSError:\n"
        "        pass\n"
        "    return n\n"
        "print(fill('/dev/shm'), fill('/dev'))\n"
        "open('/dev/null', 'w').write('still usable')\n"
    )
    r = run_tests(prog, timeout_s=30)
    assert r.passed, r.reason
    shm, dev = map(int, r.stdout.split())
    assert shm <= 4 << 20 and dev == 0, (shm, dev)  # 512 MB tried in each
