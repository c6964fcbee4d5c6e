#!/usr/bin/env python
"""Train the embedded reference model qverify-tiny and its drafter; write them to qverify/assets/.

Resumable: rerun the same command after a kill and it continues from the last checkpoint
(`--work`, default ./.qverify-train). Phases: tokenizer → target → drafter → acceptance → card.

    python scripts/train_reference_model.py                     # full run (~1 h on 2 CPU cores)
    python scripts/train_reference_model.py --smoke --out /tmp/x  # a few steps, for tests
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "qverify/assets/qverify-tiny")
    ap.add_argument("--work", type=Path, default=ROOT / ".qverify-train")
    ap.add_argument("--tokens", type=float, default=20e6, help="target training tokens")
    ap.add_argument("--drafter-tokens", type=float, default=3e6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--eval-n", type=int, default=60, help="held-out items per suite for the final scores")
    ap.add_argument("--smoke", action="store_true", help="tiny budgets: checks the script runs end to end")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    from transformers import DeepseekV3ForCausalLM, PreTrainedTokenizerFast

    from qverify.reference import arch, data, drafter, evaluate, model_card, tokenizer, train

    if args.smoke:
        args.tokens, args.drafter_tokens, args.eval_n = 6000, 3000, 4
    args.work.mkdir(parents=True, exist_ok=True)
    tok_dir = args.work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        tok = tokenizer.train_tokenizer(data.corpus_for_tokenizer(), vocab_size=768)
        tokenizer.save_tokenizer(tok, tok_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    from qverify.chatfmt import CHAT_TEMPLATE

    tok.chat_template = CHAT_TEMPLATE  # the template evolves with chatfmt; the BPE model does not
    ids = dict(vocab_size=len(tok), bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id)

    torch.manual_seed(0)
    target = DeepseekV3ForCausalLM(arch.target_config(**ids)).to(device)
    lengths = (128, 256) if args.smoke else (128, 256, 512, 768, 1024)
    cfg = train.TrainConfig(tokens=int(args.tokens), threads=args.threads,
                            eval_every_tokens=max(int(args.tokens // 4), 1), eval_n=2 if args.smoke else 30)
    if args.smoke:
        cfg.batch_tokens, cfg.ckpt_every_s = 512, 0
    t0 = time.time()
    state = train.train(target, tok, cfg, args.work, tag="target",
                        evaluate=lambda m, n: evaluate.evaluate(m, tok, n, lengths=lengths))
    print(f"target trained: {state['seen'] / 1e6:.2f}M tokens in {state['wall'] / 60:.1f} min", flush=True)

    final_path = args.work / "final_scores.json"
    if final_path.exists():
        final = json.loads(final_path.read_text())
    else:
        final = evaluate.evaluate(target, tok, args.eval_n, lengths=lengths)
        final_path.write_text(json.dumps(final))
    print("held-out:", json.dumps(final), flush=True)

    torch.manual_seed(1)
    draft = DeepseekV3ForCausalLM(arch.drafter_config(**ids)).to(device)
    dcfg = train.TrainConfig(tokens=int(args.drafter_tokens), threads=args.threads, lr=3e-3, eval_every_tokens=10**12)
    if args.smoke:
        dcfg.batch_tokens, dcfg.ckpt_every_s = 512, 0
    dstate = drafter.distill(draft, target, tok, dcfg, args.work, n_prompts=8 if args.smoke else 1200)
    accept = drafter.acceptance(target, draft, tok, n=4 if args.smoke else 40)
    print("acceptance:", json.dumps(accept), flush=True)

    model_card.write(args.out, target, draft, tok, state, dstate, final, accept, cfg, dcfg, device,
                     wall_s=time.time() - t0, threads=args.threads)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
