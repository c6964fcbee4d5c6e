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


def warm_start_record(init_from: Path | None) -> dict | None:
    """What the warm start had been trained on (its training.json, without its own warm start's)."""
    if not init_from or not (init_from / "training.json").exists():
        return None
    t = json.loads((init_from / "training.json").read_text())
    return {"tokens": t["target"]["tokens"], "minutes": t["target"]["minutes"], "curve": t["target"]["curve"],
            "drafter_tokens": t["drafter"]["tokens"], "config": t["target"]["config"]}


def stop_time(hhmm: str) -> float:
    """Epoch seconds of the next UTC HH:MM."""
    import datetime as dt

    now = dt.datetime.now(dt.timezone.utc)
    h, m = map(int, hhmm.split(":"))
    at = now.replace(hour=h, minute=m, second=0, microsecond=0)
    return (at if at > now else at + dt.timedelta(days=1)).timestamp()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "qverify/assets/qverify-tiny")
    ap.add_argument("--work", type=Path, default=ROOT / ".qverify-train")
    ap.add_argument("--tokens", type=float, default=20e6, help="target training tokens")
    ap.add_argument("--drafter-tokens", type=float, default=3e6)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--distill-prompts", type=int, default=1200, help="train prompts the target answers for the drafter")
    ap.add_argument("--eval-every", type=float, default=None, help="tokens between validation evals (default tokens/4)")
    ap.add_argument("--eval-n", type=int, default=60, help="test items per suite for the final scores")
    ap.add_argument("--init-from", type=Path, default=None,
                    help="warm start: a saved qverify-tiny (its tokenizer, weights and drafter/) instead of random init")
    ap.add_argument("--stop-at", default=None, help="UTC HH:MM: stop training there (time budget), then finish")
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
    tok_dir = args.init_from or args.work / "tokenizer"
    if not (tok_dir / "tokenizer.json").exists():
        tok = tokenizer.train_tokenizer(data.corpus_for_tokenizer(), vocab_size=768)
        tokenizer.save_tokenizer(tok, tok_dir)
    tok = PreTrainedTokenizerFast.from_pretrained(tok_dir)
    from qverify.chatfmt import CHAT_TEMPLATE

    tok.chat_template = CHAT_TEMPLATE  # the template evolves with chatfmt; the BPE model does not
    ids = dict(vocab_size=len(tok), bos=tok.bos_token_id, eos=tok.eos_token_id, pad=tok.pad_token_id)

    torch.manual_seed(0)
    if args.init_from:  # fp32 for training; the saved weights are bf16
        target = DeepseekV3ForCausalLM.from_pretrained(args.init_from, dtype=torch.float32).to(device)
    else:
        target = DeepseekV3ForCausalLM(arch.target_config(**ids)).to(device)
    lengths = (128, 256) if args.smoke else (128, 256, 512, 768, 1024)
    cfg = train.TrainConfig(tokens=int(args.tokens), threads=args.threads,
                            eval_every_tokens=max(int(args.eval_every or args.tokens // 4), 1), eval_n=2 if args.smoke else 30)
    if args.smoke:
        cfg.batch_tokens, cfg.ckpt_every_s = 512, 0
    if args.stop_at:
        cfg.stop_at = stop_time(args.stop_at)
    t0 = time.time()
    state = train.train(target, tok, cfg, args.work, tag="target",
                        task_fn=data.pick_task_warm_start if args.init_from else data.pick_task,
                        evaluate=lambda m, n: evaluate.evaluate(m, tok, n, lengths=lengths, split="validation"))
    print(f"target trained: {state['seen'] / 1e6:.2f}M tokens in {state['wall'] / 60:.1f} min", flush=True)

    final_path = args.work / "final_scores.json"
    if final_path.exists():
        final = json.loads(final_path.read_text())
    else:
        final = evaluate.evaluate(target, tok, args.eval_n, lengths=lengths, split="test")
        final_path.write_text(json.dumps(final))
    print("test:", json.dumps(final), flush=True)

    torch.manual_seed(1)
    if args.init_from:
        draft = DeepseekV3ForCausalLM.from_pretrained(args.init_from / "drafter", dtype=torch.float32).to(device)
    else:
        draft = DeepseekV3ForCausalLM(arch.drafter_config(**ids)).to(device)
    dcfg = train.TrainConfig(tokens=int(args.drafter_tokens), threads=args.threads, lr=1e-3 if args.init_from else 3e-3,
                             eval_every_tokens=10**12)
    if args.smoke:
        dcfg.batch_tokens, dcfg.ckpt_every_s = 512, 0
    dstate = drafter.distill(draft, target, tok, dcfg, args.work, n_prompts=8 if args.smoke else args.distill_prompts)
    accept_path = args.work / "acceptance.json"
    if accept_path.exists():
        accept = json.loads(accept_path.read_text())
    else:
        accept = drafter.acceptance(target, draft, tok, n=2 if args.smoke else 20)
        accept_path.write_text(json.dumps(accept))
    print("acceptance:", json.dumps(accept), flush=True)

    model_card.write(args.out, target, draft, tok, state, dstate, final, accept, cfg, dcfg, device,
                     wall_s=time.time() - t0, threads=args.threads, warm_start=warm_start_record(args.init_from),
                     test_n=args.eval_n)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
