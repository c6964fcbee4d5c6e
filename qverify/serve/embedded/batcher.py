"""A single model worker thread fed by an asyncio-friendly queue.

The model is not thread-safe, so one thread owns it; requests that arrive together are
batched (up to `max_batch`, waiting `window_s` for company), which makes batch composition
vary with load exactly as on a production server. With a drafter, requests run one by one
(transformers' assisted generation is batch 1).
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch

from qverify.serve.embedded.engine import Engine, GenRequest


@dataclass
class _Job:
    kind: str  # "gen" | "echo"
    payload: Any
    fut: asyncio.Future
    loop: asyncio.AbstractEventLoop


class Batcher:
    def __init__(self, engine: Engine, max_batch: int = 8, window_s: float = 0.01, threads: int = 1):
        self.engine = engine
        self.max_batch = 1 if engine.drafter is not None else max_batch
        self.window_s = window_s
        self.threads = threads
        self.q: queue.Queue[_Job | None] = queue.Queue()
        self.busy_s = 0.0
        self.batches = 0
        self.requests = 0
        self._t = threading.Thread(target=self._loop, name="qverify-model-worker", daemon=True)
        self._t.start()

    async def submit(self, kind: str, payload: Any) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self.q.put(_Job(kind, payload, fut, loop))
        return await fut

    def close(self) -> None:
        self.q.put(None)

    def _collect(self, first: _Job) -> list[_Job]:
        jobs = [first]
        if first.kind != "gen":
            return jobs
        deadline = time.monotonic() + self.window_s
        while len(jobs) < self.max_batch:
            try:
                j = self.q.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                break
            if j is None or j.kind != "gen":
                self.q.put(j)  # handle it next round, in order
                break
            jobs.append(j)
        return jobs

    def _loop(self) -> None:
        torch.set_num_threads(self.threads)  # one thread per worker on a 2-core box
        while True:
            first = self.q.get()
            if first is None:
                return
            jobs = self._collect(first)
            t0 = time.perf_counter()
            try:
                if first.kind == "echo":
                    ids, k = first.payload
                    results = [self.engine.prompt_logprobs(ids, k)]
                else:
                    reqs: list[GenRequest] = [j.payload for j in jobs]
                    results = self.engine.generate(reqs)
                for j, r in zip(jobs, results):
                    j.loop.call_soon_threadsafe(_resolve, j.fut, r, None)
            except Exception as e:  # report to every waiting request; the worker lives on
                for j in jobs:
                    j.loop.call_soon_threadsafe(_resolve, j.fut, None, e)
            self.busy_s += time.perf_counter() - t0
            self.batches += 1
            self.requests += len(jobs)


def _resolve(fut: asyncio.Future, result: Any, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)
