"""How much reading a cached prefix back from the FP8 pool adds to a build's KL against bf16 (issue #36.5).

    python benchmarks/fp8_prefix_kl.py [--items 150] [--replicates 3] [--workdir /tmp/prefix_kl] [--json out.json]

Builds qverify-tiny's `bf16` and `fp8kv_nvfp4shared` (the default candidate), loads both as the embedded server
does, and on the kld suite's test items (their prompt text, tokenized as the server tokenizes it) computes each
position's full-vocabulary KL(bf16 || candidate), per SGLang backend the engine emulates:
- fresh: the whole prompt prefilled at once (a radix miss, and every kld echo request, which SGLang never matches
  against its cache);
- hit: the tokens after the cached prefix (prefix_reads.cached_prefix_len: 128 of 129, ...) prefilled over the
  prefix read back from the FP8 pool, as the engine reads every generation request (the last position is the first
  generated token's distribution);
- chunk 64: every position after the first 64 reads the rows before it rounded, what positions past a chunk
  boundary of a long prompt see (SGLang's chunks are 8,192-16,384 tokens; 64 only makes it measurable here).
A per-item figure is the mean over the positions named; replicate_first: a first-arrival rule's average,
(fresh + (R - 1) hit) / R, for comparison. Prints
mean, median, p90 and max over items; no server, no sampling (the forward passes the engine runs, called directly).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch


def _kl(base: torch.Tensor, cand: torch.Tensor) -> torch.Tensor:
    """Per-row KL(base || cand) from logits [N, V], in nats."""
    lp, lq = torch.log_softmax(base.double(), -1), torch.log_softmax(cand.double(), -1)
    return (lp.exp() * (lp - lq)).sum(-1)


def _summary(x: list[float]) -> dict[str, float]:
    a = np.array(x)
    return {"mean": float(a.mean()), "median": float(np.median(a)), "p90": float(np.percentile(a, 90)),
            "max": float(a.max())}


def measure(items: int, replicates: int, workdir: Path, backends: list[str]) -> dict:
    from qverify.quantize.build import build
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.serve.embedded.prefix_reads import cached_prefix_len
    from qverify.serve.embedded.runner import ModelRunner
    from qverify.suites.kld import KLDSuite

    torch.set_num_threads(1)
    base = load_for_serving(build("bf16", workdir=workdir).build_dir, speculative=False)
    cand = load_for_serving(build("fp8kv_nvfp4shared", workdir=workdir).build_dir, speculative=False)
    tok = base.tokenizer
    prompts = [tok(it.prompt, add_special_tokens=False)["input_ids"] for it in KLDSuite().items("test", items)]
    ref = ModelRunner(base.model, slots=2)
    out: dict = {"items": len(prompts), "replicates": replicates, "tokens": [len(p) for p in prompts]}
    for backend in backends:
        runner = ModelRunner(cand.model, slots=2, fp8_kv=cand.fp8_kv, attention_backend=backend)
        assert runner.fp8_kv
        rows: dict[str, list[float]] = {k: [] for k in ("fresh_all", "fresh_tail", "hit_tail", "fresh_first",
                                                        "hit_first", "chunk64_all", "replicate_first")}
        with torch.no_grad():
            for ids in prompts:
                n = len(ids)
                everywhere = torch.arange(n)
                _, b = ref.prefill([ids], everywhere)
                kvs, fresh = runner.prefill([ids], everywhere)
                m = cached_prefix_len(n, backend)
                _, hit = runner.extend(kvs[0], m, ids[m:], torch.arange(n - m))
                runner.chunk = 64
                _, chunked = runner.prefill([ids], everywhere)
                runner.chunk = None
                kl_fresh, kl_hit = _kl(b, fresh), _kl(b[m:], hit)
                rows["fresh_all"].append(float(kl_fresh.mean()))
                rows["fresh_tail"].append(float(kl_fresh[m:].mean()))
                rows["hit_tail"].append(float(kl_hit.mean()))
                rows["fresh_first"].append(float(kl_fresh[-1]))
                rows["hit_first"].append(float(kl_hit[-1]))
                rows["chunk64_all"].append(float(_kl(b, chunked).mean()))
                rows["replicate_first"].append((float(kl_fresh[-1]) + (replicates - 1) * float(kl_hit[-1])) / replicates)
        out[backend] = {k: _summary(v) for k, v in rows.items()}
        out[backend]["hit_minus_fresh_first"] = _summary([h - f for h, f in zip(rows["hit_first"], rows["fresh_first"])])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--items", type=int, default=150)
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--backends", default="trtllm_mla,flashinfer")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args(argv)
    workdir = a.workdir or Path(tempfile.mkdtemp(prefix="prefix_kl_"))
    res = measure(a.items, a.replicates, workdir, a.backends.split(","))
    toks = res["tokens"]
    print(f"{res['items']} kld items (prompt tokens {min(toks)}-{max(toks)}, median {int(np.median(toks))}), "
          f"replicates {res['replicates']}; per-item KL(bf16 || fp8kv_nvfp4shared), nats")
    for backend in a.backends.split(","):
        print(f"\n{backend:<12} {'mean':>9} {'median':>9} {'p90':>9} {'max':>9}")
        for k, v in res[backend].items():
            print(f"  {k:<22} {v['mean']:9.5f} {v['median']:9.5f} {v['p90']:9.5f} {v['max']:9.5f}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
