"""Records tests/benchmarks/acceptance_records.json: the per-token logprob lists the GPU acceptance run's checks
consume, from the embedded engine on CPU (no GPU has run yet, so the engine stands in for SGLang: the "served"
lists are the engine at the build's SGLang-visible k_scale on trtllm_mla), for qverify-tiny's fp8kv and
fp8kv_badscale builds. Rerun: PYTHONPATH=. python tests/benchmarks/record_acceptance.py WORKDIR"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch


def main(workdir: str) -> None:
    from benchmarks.gpu import acceptance_host as host
    from qverify.quantize.build import build
    from qverify.serve.embedded.model_loader import load_for_serving

    torch.set_num_threads(1)
    lms = {r: load_for_serving(build(r, workdir=Path(workdir)).build_dir, speculative=False)
           for r in ("bf16", "fp8kv", "fp8kv_badscale")}
    layers = dict.fromkeys(range(len(lms["bf16"].model.model.layers)), 0.25)
    out: dict = {}
    for i, p in enumerate(host.prompt_ids(lms["bf16"].tokenizer)[:3]):
        toks = host.engine_greedy(lms["fp8kv_badscale"], p, 16, backend="trtllm_mla", scales=layers)
        row = {"tokens": toks, "noise": host.bf16_noise(lms["bf16"], p, toks)}
        for name, lm, kw in (("bf16", lms["bf16"], {}), ("fp8", lms["fp8kv"], {}), ("fp8_plain", lms["fp8kv"], {"fp8": False}),
                             ("badscale_k1", lms["fp8kv_badscale"], {}),
                             ("badscale_k025", lms["fp8kv_badscale"], {"scales": layers})):
            row[name] = host.engine_logprobs(lm, p, toks, backend="trtllm_mla", **kw)
        out[f"prompt{i}"] = row
    Path(__file__).with_name("acceptance_records.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(sys.argv[1])
