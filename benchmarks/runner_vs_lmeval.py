#!/usr/bin/env python
"""qverify's eval runner against lm-eval's local-chat-completions on the same endpoint, items, concurrency.

    python benchmarks/runner_vs_lmeval.py [--model DIR] [--n 32] [--concurrency 8]

Both send the same coding prompts (greedy, same max_tokens) to one embedded server. Prints
wall times, their ratio, and qverify's client-side overhead as a fraction of server busy time.
Also measures the prefix-cache-friendly order (replicates adjacent) against a shuffled order.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from pathlib import Path

import httpx


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()

    from qverify.assets import default_model_dir
    from qverify.evals.client import Client
    from qverify.models import ServingProfile
    from qverify.serve.local import LocalBackend
    from qverify.suites.coding import CodingSuite

    model_dir = args.model or default_model_dir()
    items = CodingSuite().items("test", args.n)
    tmp = Path(tempfile.mkdtemp())
    backend = LocalBackend(model_dir, None, ServingProfile(flags={"speculative": False}), tmp)
    with backend as ep:
        info = lambda: httpx.get(f"{backend.root_url}/server_info").json()  # noqa: E731

        async def qverify_run(order):
            c = Client(ep, concurrency=args.concurrency)
            try:
                await asyncio.gather(*[c.call({"messages": it.messages, "max_tokens": args.max_tokens,
                                               "temperature": 0, "seed": r}) for it, r in order])
            finally:
                await c.close()

        pairs = [(it, r) for it in items for r in range(2)]
        b0 = info()["busy_s"]
        t = time.perf_counter()
        asyncio.run(qverify_run(pairs))
        q_s = time.perf_counter() - t
        q_busy = info()["busy_s"] - b0
        shuffled = pairs[:]
        random.Random(0).shuffle(shuffled)
        t = time.perf_counter()
        asyncio.run(qverify_run(shuffled))
        shuf_s = time.perf_counter() - t

        # lm-eval: a custom generate_until task over the same prompts, through local-chat-completions
        data = tmp / "items.jsonl"
        data.write_text("\n".join(json.dumps({"q": it.messages[0]["content"], "a": ""}) for it in items))
        task_dir = tmp / "tasks"
        task_dir.mkdir()
        (task_dir / "bench.yaml").write_text(
            "task: qverify_bench\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
            f"    test: {data}\ntest_split: test\noutput_type: generate_until\ndoc_to_text: '{{{{q}}}}'\n"
            "doc_to_target: '{{a}}'\ngeneration_kwargs:\n  until: []\n"
            f"  max_gen_toks: {args.max_tokens}\n  do_sample: false\n  temperature: 0\n"
            "metric_list:\n  - metric: exact_match\n")
        import lm_eval
        from lm_eval.tasks import TaskManager

        t = time.perf_counter()
        for _ in range(2):  # two replicates, as above
            lm_eval.simple_evaluate(
                model="local-chat-completions",
                model_args=f"model={ep.model},base_url={ep.base_url}/chat/completions,num_concurrent={args.concurrency},"
                           "tokenized_requests=False,max_retries=3",
                tasks=["qverify_bench"], task_manager=TaskManager(include_path=str(task_dir)), apply_chat_template=True,
                log_samples=False)
        l_s = time.perf_counter() - t
    print(f"requests {len(pairs)} (n={args.n} × 2 replicates), concurrency {args.concurrency}, max_tokens {args.max_tokens}")
    print(f"qverify runner          : {q_s:.1f} s (server busy {q_busy:.1f} s; client overhead "
          f"{max(q_s - q_busy, 0) / max(q_busy, 1e-9) * 100:.1f}% of busy time)")
    print(f"qverify, shuffled order : {shuf_s:.1f} s (replicates-adjacent / shuffled = {q_s / shuf_s:.2f})")
    print(f"lm-eval local-chat      : {l_s:.1f} s")
    print(f"lm-eval / qverify       : {l_s / q_s:.2f}")


if __name__ == "__main__":
    main()
