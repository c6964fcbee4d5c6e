"""Memory for one coding answer, all its processes together: the bound is per answer, not per process.

RLIMIT_AS alone caps each process: with 1 GiB each and 64 processes allowed, six children held 2.76 GB. So:
  cgroup v2  where a cgroup2 hierarchy has the memory controller and we may create a child cgroup in it (root):
             each run gets its own cgroup with memory.max = ANSWER_BYTES (and no swap); every process of the
             answer is in it, and what is left is killed with the cgroup;
  rlimits    otherwise: at most FALLBACK_NPROC processes (a fresh uid per run, so RLIMIT_NPROC counts this answer
             only) of FALLBACK_AS_BYTES address space each, whose product is ANSWER_BYTES.
`memory_bound()` says which applies here (docs/security.md).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

ANSWER_BYTES = 1 << 30  # the stated bound for one answer
CGROUP_NPROC = 64  # under memory.max: enough for small multiprocessing, stops fork bombs
FALLBACK_NPROC = 8  # bwrap's own two processes, the interpreter, and five more
FALLBACK_AS_BYTES = ANSWER_BYTES // FALLBACK_NPROC  # 128 MiB: Python peaks at ~30 MB of address space
_GROUP = "qverify-sandbox"
_counter = itertools.count()


def _cgroup2_mount() -> Path | None:
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            fields = line.split()
            if len(fields) > 2 and fields[2] == "cgroup2":
                return Path(fields[1])
    except OSError:
        pass
    return None


@functools.cache
def cgroup_base() -> Path | None:
    """The cgroup v2 folder runs get their cgroups under, or None where memory.max cannot be used here."""
    mount = _cgroup2_mount()
    if os.geteuid() != 0 or mount is None:
        return None
    try:
        if "memory" not in (mount / "cgroup.controllers").read_text().split():
            return None  # a hybrid host: the memory controller is on cgroup v1
        if "memory" not in (mount / "cgroup.subtree_control").read_text().split():
            (mount / "cgroup.subtree_control").write_text("+memory")
        base = mount / _GROUP
        base.mkdir(exist_ok=True)
        if "memory" not in (base / "cgroup.subtree_control").read_text().split():
            (base / "cgroup.subtree_control").write_text("+memory")
        probe = new_cgroup(base)
        remove_cgroup(probe)
    except OSError as e:
        log.info("cgroup v2 memory.max unavailable (%s): sandbox memory bounded by rlimits", e)
        return None
    return base


def new_cgroup(base: Path) -> Path:
    """A fresh cgroup for one run, memory.max set, no swap."""
    path = base / f"run-{os.getpid()}-{next(_counter)}"
    path.mkdir()
    (path / "memory.max").write_text(str(ANSWER_BYTES))
    if (path / "memory.swap.max").exists():
        (path / "memory.swap.max").write_text("0")
    return path


def remove_cgroup(path: Path) -> None:
    """Kill whatever is left in it, then remove it (rmdir fails while a process is still exiting)."""
    kill = path / "cgroup.kill"
    for _ in range(50):
        try:
            if kill.exists():
                kill.write_text("1")
            path.rmdir()
            return
        except OSError:
            time.sleep(0.1)
    log.warning("could not remove sandbox cgroup %s", path)


def enter_argv(cgroup: Path) -> list[str]:
    """Prefix that moves the launched process into `cgroup` before it execs the rest (children follow it)."""
    return ["/bin/sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs")]


def limits(use_cgroup: bool) -> tuple[int, int]:
    """(RLIMIT_NPROC, RLIMIT_AS) for a run: the cgroup bounds the total, else their product does."""
    return (CGROUP_NPROC, ANSWER_BYTES) if use_cgroup else (FALLBACK_NPROC, FALLBACK_AS_BYTES)


def memory_bound() -> str:
    """Which bound applies on this host, in words."""
    if cgroup_base() is not None:
        return f"cgroup v2 memory.max {ANSWER_BYTES >> 20} MiB for the answer's processes together"
    return (f"{FALLBACK_NPROC} processes x {FALLBACK_AS_BYTES >> 20} MiB address space "
            f"= {ANSWER_BYTES >> 20} MiB (rlimits; no writable cgroup v2 memory controller)")
