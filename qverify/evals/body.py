"""Reading a server's answer without trusting its size, encoding or pacing.

A server (or proxy) we do not control can send an endless body, a 1 GB body or a gzip bomb;
`response.json()` would hold all of it in client RAM. Bodies are streamed and the *decoded*
size is capped, so one hostile answer costs at most about the cap plus one decoded chunk.
"""

from __future__ import annotations

import email.utils
import math
import time
import zlib
from collections.abc import AsyncIterator

import httpx

# A completion with 32k tokens and top-20 logprobs is ~10 MB of JSON; 32 MB leaves room and bounds RAM.
MAX_BODY_BYTES = 32 * 2**20
# An error answer is only kept as a 300-character detail: read no more than this of it.
MAX_ERROR_BODY_BYTES = 64 * 2**10


class BodyTooLarge(ValueError):
    """The decoded body passed the cap: the item is `bad_response` (a ValueError, like any body that is not a completion)."""


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


async def read_capped(r: httpx.Response, cap: int, strict: bool = True) -> bytes:
    """The decoded body up to `cap` bytes: over it, BodyTooLarge (strict) or the first `cap` bytes.

    A body that does not decode raises httpx.DecodingError (the caller's `bad_response`).
    """
    buf = bytearray()
    async for chunk in _decoded(r, cap):
        buf += chunk
        if len(buf) > cap:
            if strict:
                raise BodyTooLarge(f"the body is over {cap / 2**20:g} MB decoded; stopped reading it")
            return bytes(buf[:cap])
    return bytes(buf)


async def capped_lines(r: httpx.Response, cap: int = MAX_BODY_BYTES) -> AsyncIterator[str]:
    """The lines of a streamed (SSE) body, with the same cap on everything read: httpx's own
    aiter_lines would grow one endless line without bound."""
    buf, total = b"", 0
    async for chunk in _decoded(r, cap):
        total += len(chunk)
        if total > cap:
            raise BodyTooLarge(f"the stream is over {cap / 2**20:g} MB decoded; stopped reading it")
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
