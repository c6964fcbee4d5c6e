#!/usr/bin/env python
"""The embedded server's tokens/s over HTTP against its engine in-process, on the same prompts.

    python benchmarks/local_server_vs_generate.py [--model DIR] [--n 64] [--batch 64] [--max-tokens 64]

Greedy, `ignore_eos` on both sides, so both produce exactly n x max_tokens tokens. The server side adds HTTP,
JSON, chat templating and the worker thread hand-off; the ratio is the serving overhead. (The old comparison,
against `model.generate`, is in engine_throughput.py with the old path's minimal copy.)
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

import httpx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None, help="model/build dir (default: the embedded qverify-tiny)")
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from qverify.assets import default_model_dir
    from qverify.models import ServingProfile
    from qverify.serve.embedded.engine import Engine, GenRequest
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.serve.local import LocalBackend
    from qverify.suites.coding import CodingSuite

    model_dir = args.model or default_model_dir()
    items = CodingSuite().items("held-out", args.n)
    lm = load_for_serving(model_dir, speculative=False)
    tok = lm.tokenizer
    prompts = [tok.apply_chat_template(i.messages, tokenize=False, add_generation_prompt=True) for i in items]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]

    eng = Engine(lm.model, tok, max_batch=args.batch)
    t = time.perf_counter()
    res = eng.generate([GenRequest(prompt_ids=x, max_tokens=args.max_tokens, ignore_eos=True) for x in ids])
    raw_tokens = sum(len(r.token_ids) for r in res)
    raw_s = time.perf_counter() - t

    backend = LocalBackend(model_dir, None, ServingProfile(flags={"max_batch": args.batch, "speculative": False}),
                           Path(tempfile.mkdtemp()))
    with backend as ep:
        async def run():
            sem = asyncio.Semaphore(args.batch)
            async with httpx.AsyncClient(timeout=600) as c:
                async def one(it):
                    async with sem:
                        r = await c.post(f"{ep.base_url}/chat/completions", json={
                            "model": ep.model, "messages": it.messages, "max_tokens": args.max_tokens, "temperature": 0,
                            "ignore_eos": True})
                        return r.json()["usage"]["completion_tokens"]
                return sum(await asyncio.gather(*[one(it) for it in items]))

        t = time.perf_counter()
        srv_tokens = asyncio.run(run())
        srv_s = time.perf_counter() - t
    print(f"prompts {len(ids)}, batch {args.batch}, max_tokens {args.max_tokens}, model {model_dir}")
    print(f"engine in-process  : {raw_tokens} tokens in {raw_s:.1f} s = {raw_tokens / raw_s:.0f} tok/s")
    print(f"local server (HTTP): {srv_tokens} tokens in {srv_s:.1f} s = {srv_tokens / srv_s:.0f} tok/s")
    print(f"server / in-process: {(srv_tokens / srv_s) / (raw_tokens / raw_s):.2f}")


if __name__ == "__main__":
    main()
