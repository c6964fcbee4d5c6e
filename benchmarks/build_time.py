#!/usr/bin/env python
"""Build time per recipe, on the tiny random model and on the embedded qverify-tiny if installed.

    python benchmarks/build_time.py [--recipes bf16,fp8kv] [--samples 64] [--seq-len 256] [--threads 1]

Each build is forced (no reuse) into a throwaway workdir; figures are wall seconds per
phase. Prints a table; no assertions (speed is measured here, not tested).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipes", default="", help="comma-separated (default: every built-in)")
    ap.add_argument("--samples", type=int, default=64, help="calibration samples")
    ap.add_argument("--seq-len", type=int, default=256, help="calibration tokens per sample")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    for var, val in (("TQDM_DISABLE", "1"), ("LLM_COMPRESSOR_LOG_DISABLED", "true"),
                     ("COMPRESSED_TENSORS_LOG_DISABLED", "true"), ("TRANSFORMERS_VERBOSITY", "error"),
                     ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(var, val)

    import logging

    import torch

    torch.set_num_threads(args.threads)
    logging.getLogger("compressed_tensors").setLevel(logging.ERROR)  # "Could not match" for overlapping targets
    import llmcompressor  # noqa: F401  - import cost (~10 s) is not build time; pay it before the clock starts
    import transformers  # noqa: F401

    from qverify.assets import default_model_dir
    from qverify.quantize import build, list_recipes
    from tests.tiny import make_tiny_model

    names = [n for n in args.recipes.split(",") if n] or [r.recipe.name for r in list_recipes()]
    with tempfile.TemporaryDirectory() as tmp:
        models = {"tiny-random (hidden 64)": make_tiny_model(Path(tmp) / "tiny")}
        if (default_model_dir() / "config.json").is_file():
            models["qverify-tiny (embedded)"] = default_model_dir()
        print(f"threads={args.threads} calibration={args.samples}x{args.seq_len} torch={torch.__version__}")
        print(f"{'model':26} {'recipe':30} {'total s':>8} {'oneshot s':>9} {'verify s':>8} {'MB':>6}  phases")
        for label, model in models.items():
            for name in names:
                t0 = time.time()
                res = build(name, model=model, workdir=Path(tmp) / "wd", calib_samples=args.samples,
                            calib_seq_len=args.seq_len, force=True)
                total = time.time() - t0
                oneshot = sum(v for k, v in res.seconds.items() if k.startswith("oneshot"))
                phases = " ".join(f"{k}={v:.1f}" for k, v in res.seconds.items())
                print(f"{label:26} {name:30} {total:8.1f} {oneshot:9.1f} {res.seconds.get('verify', 0):8.1f} "
                      f"{res.manifest.total_bytes / 1e6:6.2f}  {phases}", flush=True)


if __name__ == "__main__":
    main()
