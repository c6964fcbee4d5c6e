"""The one thread that owns the engine, fed from the event loop.

The model is not thread-safe, so one thread runs it; between two engine steps it takes in whatever requests
arrived, so sequences join and leave at every step (continuous batching) and batch composition varies with
load as on a production server.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable

import torch

from qverify.serve.embedded.engine import Engine, GenRequest, GenResult

log = logging.getLogger("qverify.serve")

# how often a waiting request checks that its client is still there: SGLang's tokenizer manager waits 4 s between
# checks (_wait_one_response); 1 s frees a slot sooner and costs one cheap receive() per request per second
DISCONNECT_POLL_S = 1.0


class _Abort:
    def __init__(self, req: GenRequest):
        self.req = req


class EngineWorker:
    def __init__(self, engine: Engine, threads: int = 1):
        self.engine = engine
        self.threads = threads
        self.inbox: queue.Queue[tuple[GenRequest, asyncio.Future, asyncio.AbstractEventLoop] | _Abort | None] = queue.Queue()
        self.busy_s = 0.0
        self._stop = False
        self._t = threading.Thread(target=self._loop, name="qverify-engine", daemon=True)
        self._t.start()

    def start(self, req: GenRequest) -> asyncio.Future:
        """Hand `req` to the engine; the future holds its result (or its error)."""
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.inbox.put((req, fut, loop))
        return fut

    async def submit(self, req: GenRequest, gone: Callable[[], Awaitable[bool]] | None = None) -> GenResult:
        """The result of `req`. `gone` (Request.is_disconnected): checked every DISCONNECT_POLL_S while waiting; once
        it is true the sequence is aborted (its slot freed) and this raises sequence.Aborted, as SGLang aborts."""
        fut = self.start(req)
        while gone is not None and not fut.done():
            await asyncio.wait({fut}, timeout=DISCONNECT_POLL_S)
            if not fut.done() and await gone():
                self.abort(req)
                break
        return await fut

    def abort(self, req: GenRequest) -> None:
        """Drop `req` between two engine steps (a no-op once it has finished); its future gets Aborted."""
        self.inbox.put(_Abort(req))

    def close(self) -> None:
        self.inbox.put(None)

    def _take(self, block: bool) -> None:
        while True:
            try:
                item = self.inbox.get(block=block)
            except queue.Empty:
                return
            block = False
            if item is None:
                self._stop = True
                return
            if isinstance(item, _Abort):
                self.engine.abort(item.req)
                continue
            req, fut, loop = item

            def done(res, exc, fut=fut, loop=loop) -> None:
                loop.call_soon_threadsafe(_resolve, fut, res, exc)

            try:
                self.engine.add(req, done)
            except Exception as e:  # noqa: BLE001 - a bad request fails alone
                done(None, e)

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)  # one thread per worker on a 2-core box
        while not self._stop:
            self._take(block=not self.engine.has_work())
            if self._stop:
                return
            t0 = time.perf_counter()
            try:
                self.engine.step()
            except Exception as e:  # noqa: BLE001 - the batched forward itself failed: no one sequence to blame
                log.error("engine step failed, failing its %d sequences: %s: %.200s", len(self.engine.running), type(e).__name__, e)
                self.engine.fail_all(e)
            self.busy_s += time.perf_counter() - t0


def _resolve(fut: asyncio.Future, result, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
