"""The one thread that owns the engine, fed from the event loop.

The model is not thread-safe, so one thread runs it; between two engine steps it takes in whatever requests
arrived, so sequences join and leave at every step (continuous batching) and batch composition varies with
load as on a production server.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time

import torch

from qverify.serve.embedded.engine import Engine, GenRequest, GenResult


class EngineWorker:
    def __init__(self, engine: Engine, threads: int = 1):
        self.engine = engine
        self.threads = threads
        self.inbox: queue.Queue[tuple[GenRequest, asyncio.Future, asyncio.AbstractEventLoop] | None] = queue.Queue()
        self.busy_s = 0.0
        self._stop = False
        self._t = threading.Thread(target=self._loop, name="qverify-engine", daemon=True)
        self._t.start()

    async def submit(self, req: GenRequest) -> GenResult:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.inbox.put((req, fut, loop))
        return await fut

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
            except Exception as e:  # noqa: BLE001 - reported to every request in flight; the worker lives on
                self.engine.fail_all(e)
            self.busy_s += time.perf_counter() - t0


def _resolve(fut: asyncio.Future, result, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
