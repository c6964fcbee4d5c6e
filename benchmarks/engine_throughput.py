#!/usr/bin/env python
"""The embedded engine against the old HF-generate path and the hardware limit, on the main job's workload.

    python benchmarks/engine_throughput.py [--limit 20] [--old-limit 8] [--replicates 3] [--max-batch 64]

Workload: the five default suites' real held-out requests (coding, toolcall, longctx, verifier, kld) at their own
sampling, `replicates` per item with the main job's seeds, one suite at a time with every request of the suite in
flight (as `qverify eval` sends them). Both engines run in-process on one thread, so HTTP is not in the figures.

- engine: qverify.serve.embedded.engine (continuous batching, latent cache, prefix sharing);
- old: a minimal copy of the server's previous path (`model.generate`, static batches of 8, per-row sampler),
  on the first `--old-limit` items of each suite (it is slow); its tok/s is the same measure on fewer requests;
- limit: single-core fp32 GEMM FLOP/s measured now at the model's shapes x the FLOPs this workload needs
  (every weight FLOP of each prefilled prompt token and each generated token, plus MLA attention in the form
  production computes: MHA for prefill, absorbed over the latent for decode), for the tokens the engine produced.
Rates are per CPU-second of this process (time.process_time; one thread), for all three sides: on this shared
2-core box, wall time measures the other tenants as much as the code. Wall-clock rates and the box's load
(`os.getloadavg`) are printed beside them. Python's cyclic GC is run before each timed section, so one suite's
garbage (a finished engine's buffers) is not collected inside the next suite's timing (it moved kld by ~2x).
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import time

import torch


def requests_for(suite, items, replicates, tok):
    from qverify.chatfmt import SECTION_BEGIN
    from qverify.evals.runner import replicate_seed
    from qverify.serve.embedded.engine import GenRequest

    out = []
    for it in items:
        for r in range(replicates):
            b = suite.request(it)
            if it.kind == "completion":
                ids = tok(b["prompt"], add_special_tokens=False)["input_ids"]
                echo = b.get("logprobs") if b.get("echo") else None
                banned = []
            else:
                text = tok.apply_chat_template(b["messages"], tools=b.get("tools"), tokenize=False, add_generation_prompt=True)
                ids = tok(text, add_special_tokens=False)["input_ids"]
                echo = None
                banned = [] if b.get("tools") else [tok.convert_tokens_to_ids(SECTION_BEGIN)]
            out.append(GenRequest(prompt_ids=ids, max_tokens=b["max_tokens"], temperature=b["temperature"],
                                  top_p=b["top_p"], seed=replicate_seed(it.id, r), stop=b.get("stop") or [],
                                  want_logprobs=echo is not None, top_logprobs=echo or 0, prompt_logprobs=echo,
                                  bad_token_ids=banned))
    return out


def old_generate(model, tok, reqs, batch=8):
    """The previous server path, minimal: left-padded static batches through model.generate, a per-row sampler."""
    from transformers import LogitsProcessor, LogitsProcessorList

    class RowSampler(LogitsProcessor):
        def __init__(self, rs):
            self.rs, self.gens = rs, [torch.Generator().manual_seed(r.seed) for r in rs]

        def __call__(self, input_ids, scores):
            scores = scores.float().clone()
            for i, r in enumerate(self.rs):
                if r.bad_token_ids:
                    scores[i, r.bad_token_ids] = -math.inf
                if r.temperature <= 0:
                    continue
                probs = torch.softmax(scores[i] / r.temperature, -1)
                if r.top_p < 1:
                    sp, si = probs.sort(descending=True)
                    keep = torch.zeros_like(probs, dtype=torch.bool)
                    keep[si[(sp.cumsum(0) - sp) < r.top_p]] = True
                    probs = torch.where(keep, probs, 0) / torch.where(keep, probs, 0).sum()
                row = torch.full_like(scores[i], -math.inf)
                row[torch.multinomial(probs, 1, generator=self.gens[i])] = 0
                scores[i] = row
            return scores

    produced = 0
    for i in range(0, len(reqs), batch):
        rs = reqs[i: i + batch]
        for r in rs:
            if r.prompt_logprobs is not None:  # echo: one full forward, as the old engine did
                model(input_ids=torch.tensor([r.prompt_ids]))
        L = max(len(r.prompt_ids) for r in rs)
        ids = torch.full((len(rs), L), tok.pad_token_id)
        mask = torch.zeros((len(rs), L), dtype=torch.long)
        for j, r in enumerate(rs):
            ids[j, L - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[j, L - len(r.prompt_ids):] = 1
        out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max(r.max_tokens for r in rs),
                             do_sample=False, logits_processor=LogitsProcessorList([RowSampler(rs)]),
                             eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, temperature=None,
                             top_p=None, top_k=None)
        for j, r in enumerate(rs):
            new = out[j, L:].tolist()
            new = new[: new.index(tok.eos_token_id) + 1] if tok.eos_token_id in new else new  # EOS counts, as for the engine
            produced += min(len([t for t in new if t != tok.pad_token_id]), r.max_tokens)
    return produced


def gemm_flops_per_s(shapes, seconds=0.3):
    """Best single-thread fp32 GEMM rate over the given (M, K, N) shapes."""
    best = 0.0
    for m, k, n in shapes:
        a, b = torch.randn(m, k), torch.randn(k, n)
        torch.mm(a, b)
        reps, t0 = 0, time.process_time()
        while time.process_time() - t0 < seconds:
            torch.mm(a, b)
            reps += 1
        best = max(best, 2 * m * k * n * reps / (time.process_time() - t0))
    return best


def linear_flops_per_token(model) -> dict[str, float]:
    """2 x the weights one token multiplies by, split into what each kind of token needs:
    - "body": attention and dense/shared MLP Linears, top-k routed experts, except kv_b_proj and lm_head;
    - "kv_b": kv_b_proj (prefill expands every prompt token through it; decode does not run it at all: the absorbed
      form's q_nope @ W_uk and @ W_uv, counted in attention_flops, are those same weights' FLOPs);
    - "lm_head": needed only at the rows whose logits are used (a prompt's last token, every token of an echo
      prompt, every decoded token)."""
    cfg, out = model.config, {"body": 0.0, "kv_b": 0.0, "lm_head": 0.0}
    for name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if not isinstance(w, torch.Tensor) or w.dim() < 2 or "embed" in name or name.endswith("mlp.gate"):
            continue
        n = w[0].numel() if w.dim() == 3 else w.numel()  # fused experts [E, out, in]: count one expert
        if ".experts" in name:
            n *= cfg.num_experts_per_tok if w.dim() == 3 else cfg.num_experts_per_tok / cfg.n_routed_experts
        key = "lm_head" if name == "lm_head" else "kv_b" if name.endswith("kv_b_proj") else "body"
        out[key] += 2 * n
    return out


def workload_flops(model, lin, reqs, res, old_count: bool = False) -> float:
    """The FLOPs the engine's work needs: each distinct prompt prefilled once (MHA form), each generated token
    decoded once (absorbed form). `old_count`: the count before 2026-12-01 (kv_b_proj counted again for every
    decoded token, beside the absorbed products that replace it; lm_head for every prompt token), kept to
    compare with earlier figures."""
    full = lin["body"] + lin["kv_b"] + lin["lm_head"]
    flops = 0.0
    echo = {tuple(q.prompt_ids) for q in reqs if q.prompt_logprobs is not None}
    for p in {tuple(q.prompt_ids) for q in reqs}:  # each distinct prompt is prefilled once
        flops += sum(lin["body"] + lin["kv_b"] + attention_flops(model, i + 1, True) for i in range(len(p)))
        flops += lin["lm_head"] * (len(p) if old_count or p in echo else 1)
    per_decoded = full if old_count else lin["body"] + lin["lm_head"]
    for r, q in zip(res, reqs):
        n = len(r.token_ids) + (r.finish_reason == "stop")
        flops += sum(per_decoded + attention_flops(model, len(q.prompt_ids) + i + 1, False) for i in range(n))
    return flops


def attention_flops(model, context: int, prefill: bool) -> float:
    """MLA attention FLOPs for one token attending to `context` positions, summed over layers."""
    c = model.config
    H, dn, dr, dv, C = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim, c.kv_lora_rank
    if prefill:  # MHA form: scores over the qk dim, weighted sum over the v dim (kv_b_proj: linear_flops_per_token)
        per = 2 * H * (dn + dr) * context + 2 * H * dv * context
    else:  # absorbed: q_nope @ W_uk, scores over the 576-value latent, sum over the 512 latent, @ W_uv
        per = 2 * H * dn * C + 2 * H * (C + dr) * context + 2 * H * C * context + 2 * H * C * dv
    return per * c.num_hidden_layers


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="model/build dir (default: the embedded qverify-tiny)")
    ap.add_argument("--suites", default="coding,toolcall,longctx,verifier,kld")
    ap.add_argument("--limit", type=int, default=20, help="items per suite for the engine")
    ap.add_argument("--old-limit", type=int, default=8, help="items per suite for the old path (0: skip it)")
    ap.add_argument("--replicates", type=int, default=3)
    ap.add_argument("--max-batch", type=int, default=256, help="the embedded server's default")
    args = ap.parse_args()
    torch.set_num_threads(1)

    from qverify.assets import default_model_dir
    from qverify.serve.embedded.engine import Engine
    from qverify.serve.embedded.model_loader import load_for_serving
    from qverify.suites import get_suite

    lm = load_for_serving(args.model or default_model_dir(), speculative=False)
    model, tok = lm.model, lm.tokenizer
    lin = linear_flops_per_token(model)
    shapes = [(256, model.config.hidden_size, n) for n in (model.config.intermediate_size, 4 * 96, 576, model.config.vocab_size)]
    peak_before = gemm_flops_per_s(shapes)  # measured again at the end: the higher of the two is the limit
    rows = []
    for name in args.suites.split(","):
        suite = get_suite(name)
        items = suite.items("test", args.limit)
        reqs = requests_for(suite, items, args.replicates, tok)
        eng = Engine(model, tok, max_batch=args.max_batch, fp8_kv=lm.fp8_kv, sglang_scales=lm.sglang_kv_scales)
        gc.collect()  # the previous suite's garbage is collected outside this suite's timing (both paths)
        t0, w0 = time.process_time(), time.perf_counter()
        res = eng.generate(reqs)
        t_eng, w_eng = time.process_time() - t0, time.perf_counter() - w0
        gen = sum(len(r.token_ids) + (r.finish_reason == "stop") for r in res)  # EOS is a generated token too
        flops = workload_flops(model, lin, reqs, res)
        flops_old_count = workload_flops(model, lin, reqs, res, old_count=True)
        old_tps = None
        if args.old_limit:
            old_reqs = requests_for(suite, items[: args.old_limit], args.replicates, tok)
            gc.collect()
            t0, w0 = time.process_time(), time.perf_counter()
            produced = old_generate(model, tok, old_reqs)
            old_tps = produced / (time.process_time() - t0)
            print(f"  {name} old path: {len(old_reqs)} requests, {produced} tokens, {produced / (time.perf_counter() - w0):.0f} "
                  f"tok/s wall", flush=True)
        rows.append((name, len(reqs), gen, t_eng, flops, old_tps, flops_old_count))
        print(f"  {name}: {len(reqs)} requests, {gen} tokens in {t_eng:.1f} CPU-s ({gen / w_eng:.0f} tok/s wall), "
              f"load {os.getloadavg()[0]:.1f}", flush=True)
    peak_after = gemm_flops_per_s(shapes)
    peak = max(peak_before, peak_after)  # a neighbour's load lowers a reading; the higher one is the harder limit
    load = os.getloadavg()
    print(f"\nmodel {lm.info['model_path']}; {args.replicates} replicates; engine max_batch {args.max_batch}; "
          f"1 thread; load average {load[0]:.2f} {load[1]:.2f} (2 cores, shared)")
    print(f"GEMM peak (1 core, fp32, best of {len(shapes)} model shapes, the higher of before and after: "
          f"{peak_before / 1e9:.1f}, {peak_after / 1e9:.1f}): {peak / 1e9:.1f} GFLOP/s; "
          f"weights {sum(lin.values()) / 1e6:.2f} MFLOP/token (kv_b_proj {lin['kv_b'] / 1e6:.2f}, "
          f"lm_head {lin['lm_head'] / 1e6:.2f})")
    print("tok/s per CPU-second:")
    print(f"{'suite':9s} {'reqs':>5s} {'tokens':>7s} {'engine tok/s':>12s} {'old tok/s':>10s} {'limit tok/s':>11s} "
          f"{'engine/old':>10s} {'engine/limit':>12s} {'old/limit':>9s}")
    tot = [0, 0.0, 0.0, 0.0, 0.0]  # tokens, engine s, flops, old tokens-weighted s, flops (old count)
    for name, n, gen, t, flops, old_tps, flops_old_count in rows:
        eng_tps, lim_tps = gen / t, gen / (flops / peak)
        tot[0] += gen
        tot[1] += t
        tot[2] += flops
        tot[4] += flops_old_count
        if old_tps:
            tot[3] += gen / old_tps
        print(f"{name:9s} {n:5d} {gen:7d} {eng_tps:12.0f} {old_tps or float('nan'):10.0f} {lim_tps:11.0f} "
              f"{eng_tps / old_tps if old_tps else float('nan'):10.1f}x {eng_tps / lim_tps:11.0%} "
              f"{old_tps / lim_tps if old_tps else float('nan'):9.1%}")
    eng_tps, lim_tps = tot[0] / tot[1], tot[0] / (tot[2] / peak)
    old_tps = tot[0] / tot[3] if tot[3] else float("nan")
    print(f"{'ALL':9s} {'':5s} {tot[0]:7d} {eng_tps:12.0f} {old_tps:10.0f} {lim_tps:11.0f} {eng_tps / old_tps:10.1f}x "
          f"{eng_tps / lim_tps:11.0%} {old_tps / lim_tps:9.1%}")
    print(f"engine/limit under the count before 2026-12-01 (kv_b_proj twice per decoded token, lm_head on every "
          f"prompt token): {eng_tps / (tot[0] / (tot[4] / peak)):.1%} (limit {tot[0] / (tot[4] / peak):.0f} tok/s)")
    print("ALL = each suite's tokens at that suite's rate (the old path's time is extrapolated per suite from its "
          "subset); limit = those tokens' FLOPs / GEMM peak.")


if __name__ == "__main__":
    main()
