"""Answers a server should never send, from real local HTTP servers (tests/badserver.py): bodies
without end, bodies of hundreds of MB, gzip bombs, gzip labels on plain bytes, 429 with Retry-After.

Each is one item's `bad_response` (or a wait the server asked for), never a crash and never
unbounded client RAM.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from qverify.evals.client import Client, Timeouts
from qverify.evals.store import RunStore
from qverify.models import Endpoint
from tests.badserver import BadServer
from tests.evals.test_bad_servers import _eval, _workdir

# The client in a child process of its own, so its peak RSS is its own; RLIMIT_AS keeps a client
# without a cap from eating the shared machine (it dies of MemoryError instead, and the test fails).
_CHILD = r"""
import asyncio, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (2**30, 2**30))
from qverify.evals.client import Client, Timeouts
from qverify.models import Endpoint
def kb(field):
    return next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith(field))
base = kb("VmRSS:")  # after the imports: the libraries' own footprint is not the body's
async def main(url):
    c = Client(Endpoint(base_url=url, model="m"), concurrency=1, timeouts=Timeouts(5, 30, 60), retries=0)
    try:
        r = await c.call({"messages": [{"role": "user", "content": "hi"}]})
    finally:
        await c.close()
    return r
r = asyncio.run(main(sys.argv[1]))
# VmHWM, not ru_maxrss: Linux carries the forking parent's ru_maxrss into the child
print(json.dumps({"error": r.error, "detail": r.detail, "peak_above_base_mb": (kb("VmHWM:") - base) / 1024}))
"""


def _child_call(url: str) -> dict:
    p = subprocess.run([sys.executable, "-c", _CHILD, url], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_endless_huge_and_gzip_bomb_bodies_are_bad_response_in_bounded_ram():
    for mode in ("endless", "huge", "gzipbomb"):
        with BadServer(mode, huge_mb=400) as srv:
            out = _child_call(srv.url + "/v1")
        assert out["error"] == "bad_response", (mode, out)
        assert "MB decoded" in out["detail"], (mode, out)
        # the cap is 32 MB decoded; a whole 400 MB body (or its decoded bomb) would be far above this. Measured
        # against the child's own RSS after its imports, so the bound does not depend on the libraries' footprint.
        assert out["peak_above_base_mb"] < 200, (mode, out)


_CHILD_MANY = r"""
import asyncio, json, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))
from qverify.evals.body import IN_FLIGHT
from qverify.evals.client import Client, Timeouts
from qverify.models import Endpoint
async def main(url, n):
    c = Client(Endpoint(base_url=url, model="m"), concurrency=n, timeouts=Timeouts(5, 30, 120), retries=0, backoff_s=0.1)
    try:
        return await asyncio.gather(*(c.call({"messages": [{"role": "user", "content": f"hi {i}"}]}) for i in range(n)))
    finally:
        await c.close()
rs = asyncio.run(main(sys.argv[1], int(sys.argv[2])))
hwm = next(int(ln.split()[1]) for ln in open("/proc/self/status") if ln.startswith("VmHWM:"))
print(json.dumps({"errors": sorted({r.error for r in rs}), "details": sorted({r.detail.split(";")[0] for r in rs}),
                  "rss_mb": hwm / 1024, "peak_mb": IN_FLIGHT.peak / 2**20, "held_after": IN_FLIGHT.used}))
"""


def test_many_endless_bodies_at_once_stay_within_one_budget():
    """64 endless bodies read at once (#37: 1.84 GB, the 32 MB cap being per answer). All answers being read share
    one budget (body.MAX_IN_FLIGHT_BYTES, 256 MB): every item is bad_response and the client stays near it."""
    from qverify.evals.body import MAX_IN_FLIGHT_BYTES

    with BadServer("endless") as srv:
        p = subprocess.run([sys.executable, "-c", _CHILD_MANY, srv.url + "/v1", "64"], capture_output=True, text=True, check=False,
                           timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    print(out)
    # (a few may be `connection`: the stdlib server's listen backlog of 5 resets some of 64 connects at once)
    assert "bad_response" in out["errors"] and set(out["errors"]) <= {"bad_response", "connection"}, out
    assert any("budget" in d for d in out["details"]), out
    assert out["held_after"] == 0 and out["peak_mb"] <= MAX_IN_FLIGHT_BYTES / 2**20, out
    # 64 answers at the per-answer cap would be 2 GB; the budget plus the interpreter is far under 1 GB
    assert out["rss_mb"] < MAX_IN_FLIGHT_BYTES / 2**20 + 250, out  # measured 318 MB; the old client 728 MB


def _one_call(url: str, item_s: float) -> tuple:
    async def go():
        c = Client(Endpoint(base_url=url, model="m"), concurrency=1, timeouts=Timeouts(5, 30, item_s), retries=4,
                   backoff_s=0.1)
        try:
            return await c.call({"messages": [{"role": "user", "content": "hi"}]})
        finally:
            await c.close()

    return asyncio.run(go())


def test_429_retry_after_is_honoured_within_the_item_timeout():
    with BadServer("ratelimit", retry_after="2") as srv:
        r = _one_call(srv.url + "/v1", item_s=20)
        times = list(srv.post_times)
    assert r.error is None and r.attempts == 2, r
    assert times[1] - times[0] >= 1.9, times  # it waited the 2 s asked, not its own sub-second backoff

    # a wait past the item's budget is not slept through: the item is http_429 at once, saying why
    with BadServer("ratelimit", retry_after="300") as srv:
        r = _one_call(srv.url + "/v1", item_s=5)
        posts = srv.posts
    assert r.error == "http_429" and posts == 1, (r, posts)
    assert r.latency_s < 2 and "Retry-After 300s" in r.detail, r


def test_gzip_label_on_a_plain_body_is_a_per_item_bad_response(bf16_build, tmp_path):
    wd = _workdir(bf16_build, tmp_path)
    with BadServer("badgzip") as srv:
        r, _ = _eval(wd, bf16_build, srv.url, "--suites", "toolcall", "--limit", "3", "--replicates", "1")
    assert "a bug in qverify" not in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert r.returncode == 3, r.stderr  # every item errored: incomplete run, infrastructure
    rows = RunStore(wd / "runs" / bf16_build.manifest.build_id / "toolcall").results(0)
    assert len(rows) == 3 and {x.error for x in rows} == {"bad_response"}, rows
    assert all("DecodingError" in x.metadata["error_detail"] for x in rows)
