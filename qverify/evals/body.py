"""Reading a server's answer without trusting its size, encoding or pacing.

A server (or proxy) we do not control can send an endless body, a 1 GB body or a gzip bomb;
`response.json()` would hold all of it in client RAM. Bodies are streamed and the *decoded*
size is capped, so one hostile answer costs at most about the cap plus one decoded chunk. All the answers being
read at once share one budget too (IN_FLIGHT), so many hostile answers together cost at most about that budget.
"""

from __future__ import annotations

import email.utils
import math
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager

import httpx

# A completion with 32k tokens and top-20 logprobs is ~10 MB of JSON; 32 MB leaves room and bounds RAM.
MAX_BODY_BYTES = 32 * 2**20
# An error answer is only kept as a 300-character detail: read no more than this of it.
MAX_ERROR_BODY_BYTES = 64 * 2**10
# Every answer being read at once, together: 64 endless bodies at the per-answer cap held 1.84 GB (#37). 256 MB
# holds eight answers at that cap, or the few-kB answers of any concurrency many times over. A choice, not a
# measurement: it bounds the client's RAM, and an answer that would pass it is that item's `bad_response`.
MAX_IN_FLIGHT_BYTES = 256 * 2**20


class BodyTooLarge(ValueError):
    """The decoded body passed the cap: the item is `bad_response` (a ValueError, like any body that is not a completion)."""


class ByteBudget:
    """Bytes held by all the answers being read, process-wide (a lock: clients may run in several threads)."""

    def __init__(self, total: int):
        self.total, self.used, self.peak = total, 0, 0
        self._lock = threading.Lock()

    @contextmanager
    def share(self) -> Iterator[Held]:
        held = Held(self)
        try:
            yield held
        finally:
            held.hold(0)

    def _change(self, delta: int) -> None:
        with self._lock:
            if delta > 0 and self.used + delta > self.total:
                raise BodyTooLarge(f"the answers being read at once are over the client's budget of "
                                   f"{self.total / 2**20:g} MB; stopped reading this one")
            self.used += delta
            self.peak = max(self.peak, self.used)


class Held:
    """One answer's part of a ByteBudget: `hold(n)` says it now holds n bytes (BodyTooLarge past the budget)."""

    def __init__(self, budget: ByteBudget):
        self.budget, self.n = budget, 0

    def hold(self, n: int) -> None:
        if n != self.n:
            self.budget._change(n - self.n)
            self.n = n


IN_FLIGHT = ByteBudget(MAX_IN_FLIGHT_BYTES)


# We decode gzip and deflate ourselves (and ask for nothing else): httpx's decoder inflates a whole
# network read at once, and one read of a gzip bomb measured 400 MB decoded.
ACCEPT_ENCODING = "gzip, deflate"
_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS, "deflate": 32 + zlib.MAX_WBITS}
_STEP = 2**20  # the most one decompress call may produce


async def _decoded(r: httpx.Response, cap: int) -> AsyncIterator[bytes]:
    """The body decoded chunk by chunk, never more than `cap` + 1 MB inflated in all: past the cap it stops."""
    enc = r.headers.get("content-encoding", "").strip().lower()
    if enc in ("", "identity"):
        async for chunk in r.aiter_raw():
            yield chunk
        return
    if enc not in _WBITS:
        raise httpx.DecodingError(f"Content-Encoding {enc!r} was not asked for (we accept {ACCEPT_ENCODING})")
    d, total = zlib.decompressobj(_WBITS[enc]), 0
    try:
        async for chunk in r.aiter_raw():
            while chunk:
                out = d.decompress(chunk, _STEP)
                chunk = d.unconsumed_tail
                total += len(out)
                yield out
                if total > cap:
                    return
        yield d.flush()
    except zlib.error as e:
        raise httpx.DecodingError(f"the {enc} body does not decode: {e}") from None


async def read_capped(r: httpx.Response, cap: int, strict: bool = True, held: Held | None = None) -> bytes:
    """The decoded body up to `cap` bytes: over it, BodyTooLarge (strict) or the first `cap` bytes. `held`: the
    share of IN_FLIGHT it is counted in (BodyTooLarge once all answers together pass it); the caller releases it.

    A body that does not decode raises httpx.DecodingError (the caller's `bad_response`).
    """
    buf = bytearray()
    async for chunk in _decoded(r, cap):
        if held is not None:
            held.hold(len(buf) + len(chunk))
        buf += chunk
        if len(buf) > cap:
            if strict:
                raise BodyTooLarge(f"the body is over {cap / 2**20:g} MB decoded; stopped reading it")
            return bytes(buf[:cap])
    return bytes(buf)


async def capped_lines(r: httpx.Response, cap: int = MAX_BODY_BYTES) -> AsyncIterator[str]:
    """The lines of a streamed (SSE) body, with the same cap on everything read: httpx's own
    aiter_lines would grow one endless line without bound. The unfinished line is counted in IN_FLIGHT."""
    buf, total = b"", 0
    with IN_FLIGHT.share() as held:
        async for chunk in _decoded(r, cap):
            total += len(chunk)
            if total > cap:
                raise BodyTooLarge(f"the stream is over {cap / 2**20:g} MB decoded; stopped reading it")
            held.hold(len(buf) + len(chunk))
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for ln in lines:
                yield ln.rstrip(b"\r").decode("utf-8")
        if buf:
            yield buf.rstrip(b"\r").decode("utf-8")


def retry_after_s(r: httpx.Response) -> float | None:
    """Seconds a 429/503 asks us to wait (RFC 9110 §10.2.3: delay-seconds or an HTTP date), or None."""
    v = (r.headers.get("retry-after") or "").strip()
    if not v:
        return None
    try:
        s = float(v)
    except ValueError:
        try:
            s = email.utils.parsedate_to_datetime(v).timestamp() - time.time()
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
    return max(0.0, s) if not math.isnan(s) and s != math.inf else None
