#!/usr/bin/env python
"""Re-distill qverify-tiny's drafter against the committed target, which stays as it is (byte for byte).

Resumable: rerun the same command after a kill and it continues from `--work`'s checkpoint. Phases: the
target's greedy answers to train prompts (the pool) → distillation (induction warm-up, then the pool with
induction and copy mixed in; see qverify/reference/drafter.py) → accept length per suite, as the embedded
engine serves it → drafter/ and training.json in the asset folder → the card re-rendered.

    python scripts/train_drafter.py --tokens 3e6 --threads 1
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--asset", type=Path, default=ROOT / "qverify/assets/qverify-tiny")
    ap.add_argument("--work", type=Path, default=ROOT / ".qverify-train-drafter")
    ap.add_argument("--tokens", type=float, default=3e6)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--distill-prompts", type=int, default=1200)
    ap.add_argument("--accept-n", type=int, default=30, help="test items per suite for the accept length")
    ap.add_argument("--smoke", action="store_true", help="tiny budgets, writes to --asset (use a copy)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from qverify.reference import drafter, model_card, train
    from qverify.reference.arch import param_counts

    if args.smoke:
        args.tokens, args.distill_prompts, args.accept_n = 3000, 16, 2
    args.work.mkdir(parents=True, exist_ok=True)
    target_sha = sha256(args.asset / "model.safetensors")
    tok = AutoTokenizer.from_pretrained(args.asset)
    target = AutoModelForCausalLM.from_pretrained(args.asset, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(args.asset / "drafter", dtype=torch.float32)
    before_path = args.work / "acceptance_before.json"
    if not before_path.exists():
        before_path.write_text(json.dumps(drafter.acceptance(target, draft.eval(), tok, n=args.accept_n)))
    t0 = time.time()
    cfg = train.TrainConfig(tokens=int(args.tokens), threads=args.threads, lr=args.lr, eval_every_tokens=10**12)
    if args.smoke:
        cfg.batch_tokens, cfg.ckpt_every_s = 512, 0
    dstate = drafter.distill(draft, target, tok, cfg, args.work, n_prompts=args.distill_prompts)
    print(f"drafter distilled: {dstate['seen'] / 1e6:.2f}M tokens in {dstate['wall'] / 60:.1f} min", flush=True)
    accept_path = args.work / "acceptance.json"
    if not accept_path.exists():
        accept_path.write_text(json.dumps(drafter.acceptance(target, draft.eval(), tok, n=args.accept_n)))
    accept = json.loads(accept_path.read_text())
    print("acceptance:", json.dumps(accept), flush=True)

    tmp = args.asset / "drafter.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model_card._save(draft, tok, tmp)
    shutil.rmtree(args.asset / "drafter")
    tmp.rename(args.asset / "drafter")
    t = json.loads((args.asset / "training.json").read_text())
    pool = [json.loads(x)["task"] for x in (args.work / "distill.jsonl").read_text().splitlines()]
    t["drafter"] = {"config": train.config_dict(cfg), "tokens": dstate["seen"], "minutes": round(dstate["wall"] / 60, 1),
                    "mix": drafter.DRAFT_MIX, "induction_first": drafter.INDUCTION_FIRST,
                    "pool": {k: pool.count(k) for k in drafter.POOL_MIX}, "warm_start": t.get("drafter"),
                    "acceptance_before": json.loads(before_path.read_text()),
                    "total_wall_minutes": round((time.time() - t0) / 60, 1)}
    t["acceptance"], t["drafter_params"] = accept, param_counts(draft)
    (args.asset / "training.json").write_text(json.dumps(t, indent=2))
    model_card.render_card(args.asset)
    assert sha256(args.asset / "model.safetensors") == target_sha, "the target's weights changed"
    print(f"wrote {args.asset / 'drafter'}; target unchanged (sha256 {target_sha[:12]})")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
